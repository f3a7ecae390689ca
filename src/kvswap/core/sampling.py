"""Sampling parameters of one request, as llama-server names and defaults them.

Pure data: the backend builds a libllama sampler chain from it. Defaults are those of
llama-server's `common_params_sampling`; the server's flags (`--temp`, `--top-k`, ...) replace
them per server, and each request's fields replace them per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # "pick a random seed", as libllama

# llama-server's default chain order (common.h).
DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)

DEFAULT_DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")

# Names (and llama-server's aliases and one-letter codes) accepted in `samplers`.
SAMPLER_ALIASES: dict[str, str] = {
    "penalties": "penalties",
    "dry": "dry",
    "top_n_sigma": "top_n_sigma",
    "top-n-sigma": "top_n_sigma",
    "top_k": "top_k",
    "top-k": "top_k",
    "typ_p": "typ_p",
    "typ-p": "typ_p",
    "typical_p": "typ_p",
    "typical-p": "typ_p",
    "typical": "typ_p",
    "top_p": "top_p",
    "top-p": "top_p",
    "nucleus": "top_p",
    "min_p": "min_p",
    "min-p": "min_p",
    "xtc": "xtc",
    "temperature": "temperature",
    "temp": "temperature",
    "adaptive_p": "adaptive_p",
    "adaptive-p": "adaptive_p",
}
SAMPLER_CHARS: dict[str, str] = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
    "a": "adaptive_p",
}


@dataclass(frozen=True)
class SamplingParams:
    """Every knob of one request's sampler chain."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    repeat_last_n: int = 64  # -1: the whole context
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: the whole context
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    min_keep: int = 0
    seed: int = LLAMA_DEFAULT_SEED
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    samplers: tuple[str, ...] = field(default=DEFAULT_SAMPLERS)
    # Constrained output: a GBNF grammar (root rule `root`) for a grammar sampler kept apart
    # from the chain, so prompt tokens are never fed to it (llama-server's
    # `accept_grammar=false`). With trigger patterns (ECMAScript regexes) or tokens the grammar
    # is lazy: text is free until a trigger appears, constrained from the trigger on.
    grammar: str = ""
    grammar_trigger_patterns: tuple[str, ...] = ()
    grammar_trigger_tokens: tuple[int, ...] = ()
    # Keep each step's candidates after the chain, for `post_sampling_probs`.
    record_candidates: bool = False

    @property
    def grammar_lazy(self) -> bool:
        return bool(self.grammar) and bool(
            self.grammar_trigger_patterns or self.grammar_trigger_tokens
        )

    def history_needed(self, n_ctx_slot: int) -> int:
        """How many trailing prompt tokens the chain must see to match accepting them all."""
        lasts = [self.repeat_last_n, self.dry_penalty_last_n]
        if any(n < 0 for n in lasts):
            return n_ctx_slot
        return max(lasts)
