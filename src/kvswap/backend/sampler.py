"""One request's libllama sampler chain, built in llama-server's order, and its grammar.

Owns the chain pointer and the grammar sampler's (both freed by `close` when the request
releases its slot). Without a grammar or recorded candidates the chain samples a slot's own
output row in C (`Context.sample`); Python never touches the logits on that path.

With a grammar, sampling is llama-server's `common_sampler_sample`: the grammar sampler is kept
apart from the chain (prompt history fed through `accept` never reaches it); the chain samples
first, the grammar checks that one token, and only when it refuses does the grammar filter the
whole candidate array before the chain samples again. The chosen token is then accepted by both.
If the grammar leaves no candidate at all, an end-of-generation token ends the request instead
of feeding libllama a token it would abort on. `record_candidates` keeps the candidates after
the chain for `post_sampling_probs` (llama-server's `common_sampler_get_candidates`).

Beyond llama-server, a grammar-constrained output is also kept valid UTF-8 (libllama's grammar
reads bytes as code points and admits overlong forms and surrogates, which would reach the
client as U+FFFD and break, say, a string's `maxLength`): a token that would break it counts as
refused, and the second pass rules out every such token.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from kvswap.backend.bindings import llama_cpp
from kvswap.backend.context import Context
from kvswap.backend.grammar import GrammarError, new_grammar_sampler
from kvswap.backend.vocab import Vocab, utf8_prefix
from kvswap.core.sampling import SamplingParams
from kvswap.core.types import TokenProb, TokenProbs

log = logging.getLogger("kvswap.sampler")

# llama_token_data {int32 id; float logit; float p}, as a numpy record (12 bytes, no padding).
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


def _logit_bias(vocab: Vocab, params: SamplingParams) -> list[tuple[int, float]]:
    biases = [(tok, bias) for tok, bias in params.logit_bias if vocab.valid(tok)]
    if params.ignore_eos:
        biases += [(tok, -math.inf) for tok in vocab.eog_tokens]
    n_suppress = ctypes.c_int32(0)
    suppress = llama_cpp.llama_vocab_get_suppress_tokens(vocab.ptr, ctypes.byref(n_suppress))
    biases += [(int(suppress[i]), -math.inf) for i in range(n_suppress.value)]
    return biases


def _view(arr: Any) -> Any:
    """The candidates a `llama_token_data_array` holds now, as numpy records (no copy)."""
    raw = ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_uint8))
    return np.ctypeslib.as_array(raw, shape=(arr.size * TOKEN_DATA.itemsize,)).view(TOKEN_DATA)


class SamplerChain:
    """A sampler chain (and grammar sampler) for one request."""

    def __init__(self, vocab: Vocab, params: SamplingParams, n_ctx_slot: int) -> None:
        self.params = params
        self.vocab = vocab
        cparams = llama_cpp.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(cparams)
        self._keepalive: list[object] = []
        for smpl in self._stages(vocab, params, n_ctx_slot):
            llama_cpp.llama_sampler_chain_add(self.ptr, smpl)
        self.seed: int = int(llama_cpp.llama_sampler_get_seed(self.ptr))
        self.grammar: Any = None
        # Set when the grammar could not be built here (the HTTP layer checks grammars first,
        # so this is a safety net: the request then ends at its first token).
        self.grammar_failed = False
        if params.grammar:
            try:
                self.grammar = new_grammar_sampler(
                    vocab,
                    params.grammar,
                    params.grammar_trigger_patterns,
                    params.grammar_trigger_tokens,
                )
            except GrammarError:
                log.error("a request's grammar was refused on the engine thread")
                self.grammar_failed = True
        self._manual = self.grammar is not None or params.record_candidates
        self._cand: npt.NDArray[np.void] | None = None
        self._last: npt.NDArray[np.void] | None = None  # candidates after the chain
        self._end_token = vocab.eos if vocab.valid(vocab.eos) else vocab.eog_tokens[0]
        self._pending = b""  # an incomplete UTF-8 character at the end of the output

    def _stages(self, vocab: Vocab, p: SamplingParams, n_ctx_slot: int) -> Iterable[object]:
        n_vocab = vocab.n_tokens
        biases = _logit_bias(vocab, p)
        if biases:
            arr = (llama_cpp.llama_logit_bias * len(biases))(
                *(llama_cpp.llama_logit_bias(tok, bias) for tok, bias in biases)
            )
            self._keepalive.append(arr)
            yield llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), arr)
        seed = p.seed & 0xFFFFFFFF
        if p.mirostat == 1:
            yield llama_cpp.llama_sampler_init_temp(p.temperature)
            yield llama_cpp.llama_sampler_init_mirostat(
                n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100
            )
            return
        if p.mirostat == 2:
            yield llama_cpp.llama_sampler_init_temp(p.temperature)
            yield llama_cpp.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta)
            return
        for name in p.samplers:
            stage = self._stage(name, vocab, p, n_ctx_slot, seed)
            if stage is not None:
                yield stage
        if "adaptive_p" in p.samplers:
            yield llama_cpp.llama_sampler_init_adaptive_p(p.adaptive_target, p.adaptive_decay, seed)
        else:
            yield llama_cpp.llama_sampler_init_dist(seed)

    def _stage(
        self, name: str, vocab: Vocab, p: SamplingParams, n_ctx_slot: int, seed: int
    ) -> object | None:
        """The sampler of one named stage of the chain (`samplers`, in llama-server's names);
        None for a name that adds none here (`adaptive_p` is the chain's last stage)."""
        n_vocab = vocab.n_tokens
        if name == "penalties":
            repeat_last_n = n_ctx_slot if p.repeat_last_n < 0 else p.repeat_last_n
            return llama_cpp.llama_sampler_init_penalties(
                n_vocab, repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            )
        if name == "dry":
            dry_last_n = n_ctx_slot if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
            breakers = [b.encode() for b in p.dry_sequence_breakers]
            c_breakers = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
            self._keepalive.append(c_breakers)
            return llama_cpp.llama_sampler_init_dry(
                vocab.ptr, p.dry_multiplier, p.dry_base, p.dry_allowed_length, dry_last_n,
                c_breakers, len(breakers),
            )  # fmt: skip
        if name == "top_k":
            return llama_cpp.llama_sampler_init_top_k(p.top_k)
        if name == "top_p":
            return llama_cpp.llama_sampler_init_top_p(p.top_p, p.min_keep)
        if name == "top_n_sigma":
            return llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma)
        if name == "min_p":
            return llama_cpp.llama_sampler_init_min_p(p.min_p, p.min_keep)
        if name == "xtc":
            return llama_cpp.llama_sampler_init_xtc(
                p.xtc_probability, p.xtc_threshold, p.min_keep, seed
            )
        if name == "typ_p":
            return llama_cpp.llama_sampler_init_typical(p.typical_p, p.min_keep)
        if name == "temperature":
            return llama_cpp.llama_sampler_init_temp_ext(
                p.temperature, p.dynatemp_range, p.dynatemp_exponent
            )
        return None

    def sample(self, ctx: Context, i: int) -> int:
        """Sample batch output `i` of `ctx` (the token is accepted into the chain and grammar)."""
        if self.grammar_failed:
            return self._end_token
        if not self._manual:
            return ctx.sample(self.ptr, i)
        logits = ctx.logits(i)
        arr = self._candidates(logits)
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        token = int(arr.data[arr.selected].id)
        if self.grammar is not None and not (
            self._grammar_allows(token) and self._utf8_allows(token)
        ):
            # Rejection: filter the whole array by UTF-8 and the grammar, then run the chain.
            arr = self._candidates(logits)
            self._mask_broken_utf8()
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(arr))
            if not np.isfinite(_view(arr)["logit"]).any():
                log.warning("the grammar admits no token here: ending the request")
                return self._end_token
            llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
            token = int(arr.data[arr.selected].id)
            if not self._grammar_allows(token):
                # The chain ruled out all the grammar admits (a complete grammar admits only
                # the end of generation, which `ignore_eos` bans): libllama's grammar would
                # abort the process on the token it drew instead.
                log.warning("the grammar is complete and the sampler bans its end: ending")
                return self._end_token
        if self.params.record_candidates:
            self._last = _view(arr).copy()
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
            self._pending = utf8_prefix(self._pending + self.vocab.piece(token)) or b""
        llama_cpp.llama_sampler_accept(self.ptr, token)
        return token

    def _utf8_allows(self, token: int) -> bool:
        return utf8_prefix(self._pending + self.vocab.piece(token)) is not None

    def _mask_broken_utf8(self) -> None:
        """Rule out (in the fresh candidate array) every token that would make the text invalid
        UTF-8. libllama's grammar reads bytes as code points and lets overlong forms,
        surrogates and values past U+10FFFF through; the text would then hold U+FFFD and
        miss the schema (a string's length, say)."""
        cur = self._cand
        assert cur is not None
        starts, first = self.vocab.utf8_table()
        if not self._pending:
            cur["logit"][~starts] = -math.inf
            return
        # Inside a character: only tokens starting with a continuation byte can follow; check
        # those few exactly.
        cont = (first >= 0x80) & (first < 0xC0)
        ok = np.zeros(len(cur), dtype=bool)
        for tok in np.flatnonzero(cont):
            ok[tok] = self._utf8_allows(int(tok))
        cur["logit"][~ok] = -math.inf

    def _candidates(self, logits: npt.NDArray[np.float32]) -> Any:
        """The full candidate array over `logits`, and the `llama_token_data_array` viewing it."""
        n = len(logits)
        if self._cand is None or len(self._cand) != n:
            self._cand = np.empty(n, dtype=TOKEN_DATA)
        cur = self._cand
        cur["id"] = np.arange(n, dtype=np.int32)
        cur["logit"] = logits
        cur["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=ctypes.cast(cur.ctypes.data, llama_cpp.llama_token_data_p),
            size=n,
            selected=-1,
            sorted=False,
        )
        return arr

    def _grammar_allows(self, token: int) -> bool:
        one = llama_cpp.llama_token_data(token, 1.0, 0.0)
        arr = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(one), size=1, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        return math.isfinite(one.logit)

    def post_sampling_probs(self, token: int, n_probs: int) -> TokenProbs | None:
        """The last step's candidates after the chain (`record_candidates`), most likely
        first, without zero probabilities; None when nothing was recorded."""
        cur = self._last
        if cur is None:
            return None
        order = np.argsort(-cur["p"], kind="stable")
        top = [
            TokenProb(int(cur["id"][j]), self.vocab.piece(int(cur["id"][j])), float(cur["p"][j]))
            for j in order[:n_probs]
            if cur["p"][j] > 0.0
        ]
        hit = np.flatnonzero(cur["id"] == token)
        prob = float(cur["p"][hit[0]]) if len(hit) else 0.0
        return TokenProbs(token=token, piece=self.vocab.piece(token), prob=prob, top=tuple(top))

    def accept(self, token: int) -> None:
        """Feed a token the chain did not sample (prompt history); never the grammar."""
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
            self._keepalive.clear()
        if self.grammar is not None:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None
