"""One request's libllama sampler chain, built in llama-server's order.

Owns the chain pointer (freed by `close` when the request releases its slot). The chain samples
a slot's own output row in C (`Context.sample`); Python never touches the logits on that path.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable

import llama_cpp

from kvswap.backend.context import Context
from kvswap.backend.vocab import Vocab
from kvswap.engine.sampling import SamplingParams


def _logit_bias(vocab: Vocab, params: SamplingParams) -> list[tuple[int, float]]:
    biases = [(tok, bias) for tok, bias in params.logit_bias if vocab.valid(tok)]
    if params.ignore_eos:
        biases += [(tok, -math.inf) for tok in vocab.eog_tokens]
    n_suppress = ctypes.c_int32(0)
    suppress = llama_cpp.llama_vocab_get_suppress_tokens(vocab.ptr, ctypes.byref(n_suppress))
    biases += [(int(suppress[i]), -math.inf) for i in range(n_suppress.value)]
    return biases


class SamplerChain:
    """A sampler chain for one request."""

    def __init__(self, vocab: Vocab, params: SamplingParams, n_ctx_slot: int) -> None:
        self.params = params
        cparams = llama_cpp.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self.ptr = llama_cpp.llama_sampler_chain_init(cparams)
        self._keepalive: list[object] = []
        for smpl in self._stages(vocab, params, n_ctx_slot):
            llama_cpp.llama_sampler_chain_add(self.ptr, smpl)
        self.seed: int = int(llama_cpp.llama_sampler_get_seed(self.ptr))

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
        repeat_last_n = n_ctx_slot if p.repeat_last_n < 0 else p.repeat_last_n
        dry_last_n = n_ctx_slot if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
        for name in p.samplers:
            if name == "penalties":
                yield llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    repeat_last_n,
                    p.repeat_penalty,
                    p.frequency_penalty,
                    p.presence_penalty,
                )
            elif name == "dry":
                breakers = [b.encode() for b in p.dry_sequence_breakers]
                c_breakers = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
                self._keepalive.append(c_breakers)
                yield llama_cpp.llama_sampler_init_dry(
                    vocab.ptr,
                    p.dry_multiplier,
                    p.dry_base,
                    p.dry_allowed_length,
                    dry_last_n,
                    c_breakers,
                    len(breakers),
                )
            elif name == "top_k":
                yield llama_cpp.llama_sampler_init_top_k(p.top_k)
            elif name == "top_p":
                yield llama_cpp.llama_sampler_init_top_p(p.top_p, p.min_keep)
            elif name == "top_n_sigma":
                yield llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma)
            elif name == "min_p":
                yield llama_cpp.llama_sampler_init_min_p(p.min_p, p.min_keep)
            elif name == "xtc":
                yield llama_cpp.llama_sampler_init_xtc(
                    p.xtc_probability, p.xtc_threshold, p.min_keep, seed
                )
            elif name == "typ_p":
                yield llama_cpp.llama_sampler_init_typical(p.typical_p, p.min_keep)
            elif name == "temperature":
                yield llama_cpp.llama_sampler_init_temp_ext(
                    p.temperature, p.dynatemp_range, p.dynatemp_exponent
                )
        if "adaptive_p" in p.samplers:
            yield llama_cpp.llama_sampler_init_adaptive_p(p.adaptive_target, p.adaptive_decay, seed)
        else:
            yield llama_cpp.llama_sampler_init_dist(seed)

    def sample(self, ctx: Context, i: int) -> int:
        """Sample batch output `i` of `ctx` (the token is accepted into the chain)."""
        return ctx.sample(self.ptr, i)

    def accept(self, token: int) -> None:
        """Feed a token the chain did not sample (prompt history)."""
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
            self._keepalive.clear()
