"""Counters the engine keeps, with llama-server's meanings.

Mutated only by the engine thread; `snapshot()` hands HTTP handlers an immutable copy. The
"bucket" rates (tokens/s since the last /metrics read) are computed from the cumulative
counters by the reader, so reading never mutates engine state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvswap.engine.spec.speculate import Speculator


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything /metrics prints (besides gauges read from the slots at the time)."""

    prompt_tokens_total: int = 0  # evaluated prompt tokens (cache hits excluded)
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_steps_total: int = 0  # generated tokens that cost a decode step
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    requests_processing: int = 0
    requests_deferred: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    spec_decode_num_drafts_total: int = 0
    extra: dict[str, float] = field(default_factory=dict)  # kvswap's own (page store, ...)

    @property
    def n_busy_slots_per_decode(self) -> float:
        return self.n_busy_slots_total / max(1, self.n_decode_total)


class EngineMetrics:
    """The engine's mutable counters."""

    def __init__(self) -> None:
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0
        self.prompt_seconds_total = 0.0
        self.tokens_predicted_total = 0
        self.tokens_predicted_steps_total = 0
        self.tokens_predicted_seconds_total = 0.0
        self.n_decode_total = 0
        self.n_busy_slots_total = 0
        self.n_tokens_max = 0

    def on_decode(
        self, n_busy_slots: int, n_prompt_tokens: int, seconds: float, max_tokens: int
    ) -> None:
        """One successful llama_decode: its busy slots, prompt tokens and duration."""
        self.n_decode_total += 1
        self.n_busy_slots_total += n_busy_slots
        self.n_tokens_max = max(self.n_tokens_max, max_tokens)
        if n_prompt_tokens:
            self.prompt_tokens_total += n_prompt_tokens
            self.prompt_seconds_total += seconds

    def on_prompt_cached(self, n_tokens: int) -> None:
        self.prompt_tokens_cached_total += n_tokens

    def on_prediction(self, n_tokens: int, seconds: float) -> None:
        """A request finished generating `n_tokens` over `seconds`."""
        self.tokens_predicted_total += n_tokens
        self.tokens_predicted_steps_total += max(0, n_tokens - 1)
        self.tokens_predicted_seconds_total += seconds

    def snapshot(
        self,
        requests_processing: int,
        requests_deferred: int,
        spec: Speculator | None = None,
        **extra: float,
    ) -> MetricsSnapshot:
        """The counters now; `spec` supplies the speculative ones (the drafter counts them)."""
        return MetricsSnapshot(
            prompt_tokens_total=self.prompt_tokens_total,
            prompt_tokens_cached_total=self.prompt_tokens_cached_total,
            prompt_seconds_total=self.prompt_seconds_total,
            tokens_predicted_total=self.tokens_predicted_total,
            tokens_predicted_steps_total=self.tokens_predicted_steps_total,
            tokens_predicted_seconds_total=self.tokens_predicted_seconds_total,
            n_decode_total=self.n_decode_total,
            n_busy_slots_total=self.n_busy_slots_total,
            n_tokens_max=self.n_tokens_max,
            requests_processing=requests_processing,
            requests_deferred=requests_deferred,
            spec_decode_num_draft_tokens_total=spec.n_draft_tokens_total if spec else 0,
            spec_decode_num_accepted_tokens_total=spec.n_accepted_tokens_total if spec else 0,
            spec_decode_num_drafts_total=spec.n_drafts_total if spec else 0,
            extra=dict(extra),
        )
