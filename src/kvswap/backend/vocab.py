"""The model's vocabulary: tokenize, token pieces, special tokens.

Read-only libllama vocabulary calls, safe from any thread (HTTP handlers tokenize off the engine
thread). Token pieces are cached per token, so turning a generated token into bytes on the hot
path is a list lookup.
"""

from __future__ import annotations

import codecs
import ctypes

import numpy as np
import numpy.typing as npt

from kvswap.backend.bindings import llama_cpp

TokenArray = npt.NDArray[np.int32]


def utf8_prefix(data: bytes) -> bytes | None:
    """The incomplete character `data` ends with (b"" if none), or None when `data` is not
    the start of valid UTF-8 (an invalid byte, an overlong form, a surrogate, past U+10FFFF)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return None
    tail = bytes(decoder.getstate()[0])
    # Python's decoder judges a held-back character only once it is complete; a second byte
    # can already doom it (E0 and F0 need no overlong form, ED no surrogate, F4 <= U+10FFFF).
    if len(tail) >= 2:
        lo, hi = _SECOND_BYTE.get(tail[0], (0x80, 0xBF))
        if not lo <= tail[1] <= hi:
            return None
    return tail


_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


class Vocab:
    """Wraps a `llama_vocab` pointer owned by the model."""

    def __init__(self, ptr: llama_cpp.llama_vocab_p) -> None:
        self.ptr = ptr
        self.n_tokens: int = llama_cpp.llama_vocab_n_tokens(ptr)
        self.bos: int = llama_cpp.llama_vocab_bos(ptr)
        self.eos: int = llama_cpp.llama_vocab_eos(ptr)
        self.eot: int = llama_cpp.llama_vocab_eot(ptr)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(ptr))
        self.add_eos: bool = bool(llama_cpp.llama_vocab_get_add_eos(ptr))
        self._pieces: list[bytes | None] = [None] * self.n_tokens
        self._special_pieces: list[bytes | None] = [None] * self.n_tokens
        self._eog = np.zeros(self.n_tokens, dtype=bool)
        for tok in range(self.n_tokens):
            if llama_cpp.llama_vocab_is_eog(ptr, tok):
                self._eog[tok] = True
        self.eog_tokens: tuple[int, ...] = tuple(int(t) for t in np.flatnonzero(self._eog))
        self._utf8_table: tuple[npt.NDArray[np.bool_], npt.NDArray[np.int16]] | None = None

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> TokenArray:
        """Tokens of `text`; `add_special` adds BOS/EOS as the model asks."""
        data = text.encode("utf-8", "surrogatepass")
        cap = len(data) + 8
        while True:
            out = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.ptr, data, len(data), out, cap, add_special, parse_special
            )
            if n >= 0:
                return np.ctypeslib.as_array(out)[:n].astype(np.int32, copy=True)
            cap = -n

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def valid(self, token: int) -> bool:
        return 0 <= token < self.n_tokens

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token; control tokens are empty unless `special`."""
        table = self._special_pieces if special else self._pieces
        cached = table[token]
        if cached is None:
            cached = self._render_piece(token, special)
            table[token] = cached
        return cached

    def _render_piece(self, token: int, special: bool) -> bytes:
        cap = 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = llama_cpp.llama_token_to_piece(self.ptr, token, buf, cap, 0, special)
            if n >= 0:
                return buf.raw[:n]
            cap = -n

    def utf8_table(self) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int16]]:
        """Per token: whether its bytes can start valid UTF-8 text (possibly ending in an
        incomplete character), and its first byte (-1 when empty). Computed once, on first
        use (grammar-constrained output keeps its text valid UTF-8 with it)."""
        if self._utf8_table is None:
            starts = np.ones(self.n_tokens, dtype=bool)
            first = np.full(self.n_tokens, -1, dtype=np.int16)
            for tok in range(self.n_tokens):
                piece = self.piece(tok)
                if piece:
                    first[tok] = piece[0]
                    # Most pieces are ASCII, valid by definition: skip the decoder for them.
                    starts[tok] = piece.isascii() or utf8_prefix(piece) is not None
            self._utf8_table = (starts, first)
        return self._utf8_table

    def detokenize(self, tokens: TokenArray | list[int], special: bool = False) -> str:
        """Text of a token list (invalid UTF-8 replaced)."""
        return b"".join(self.piece(int(t), special) for t in tokens).decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of a token (for logging and /tokenize pieces)."""
        raw = llama_cpp.llama_vocab_get_text(self.ptr, token)
        return raw.decode("utf-8", "replace") if raw else ""
