"""A request while it runs on a slot: its prompt progress, sampler, text and timings.

Owned by the engine thread from admission to release. `accept_token` applies one sampled token
(end-of-generation, stop strings, `n_predict`, the slot's window, the time limit) and returns the
event to stream, if any; `completion` builds the final result. The sampler chain is freed by
`close`, which the engine calls when it releases the slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvswap.core.types import (
    Completion,
    Event,
    GenerationRequest,
    MindServed,
    PromptProgress,
    StopType,
    Timings,
    TokenEvent,
    TokenProbs,
)
from kvswap.text.output import TextAssembler

if TYPE_CHECKING:
    from kvswap.backend.sampler import SamplerChain

Sink = Callable[[Event], None]


@dataclass
class SpecCounters:
    """One request's drafting, reported in its timings."""

    enabled: bool = False  # the server speculates (timings then carry these fields)
    draft_n: int = 0  # draft tokens sent to the target
    draft_n_accepted: int = 0  # of those, accepted
    draft_prompt_n: int = 0  # prompt tokens the draft model evaluated


class RunningRequest:
    """Per-request state on a slot (see the module docstring)."""

    def __init__(
        self,
        req_id: int,
        request: GenerationRequest,
        prompt: npt.NDArray[np.int32],
        sink: Sink,
        sampler: SamplerChain,
        n_cache: int,
        admitted: int,
        served: MindServed | None = None,
    ) -> None:
        self.req_id = req_id
        self.request = request
        self.prompt = prompt
        self.sink = sink
        self.sampler = sampler
        self.admitted = admitted
        self.n_cache = n_cache  # prompt tokens reused from the slot's cache (cache_n)
        self.served = served  # a mind's request: how its mind was served
        self.n_done = n_cache  # prompt tokens in the KV
        self.pending: int | None = None  # sampled, not yet decoded
        self.draft: list[int] = []  # this step's draft tokens after `pending` (speculative)
        self.spec = SpecCounters()
        self.checkpoint_at: list[int] = []  # token counts at which to checkpoint the slot
        self.out_index = -1  # this step's logits row in the batch
        self.generated: list[int] = []
        self.probs: list[TokenProbs] = []
        self.text = TextAssembler(request.stop)
        self.stop_type = StopType.NONE
        self.finished = False
        self.cancelled = False
        self.t_start = time.perf_counter()
        self.t_prompt_end = 0.0
        self.t_last = 0.0

    # -- prompt --------------------------------------------------------------------------

    @property
    def n_prompt_left(self) -> int:
        return len(self.prompt) - self.n_done

    def chunk_limit(self) -> int:
        """The next prompt chunk must end at the next checkpoint (0: no limit)."""
        return self.checkpoint_at[0] - self.n_done if self.checkpoint_at else 0

    def checkpoint_due(self, n_tokens: int) -> bool:
        """Is a checkpoint due with the slot holding `n_tokens` (consumed when it is)?"""
        while self.checkpoint_at and self.checkpoint_at[0] < n_tokens:
            self.checkpoint_at.pop(0)
        if self.checkpoint_at and self.checkpoint_at[0] == n_tokens:
            self.checkpoint_at.pop(0)
            return True
        return False

    def progress(self) -> PromptProgress:
        """Where the prefill is; the first (sent on admission) has evaluated nothing yet."""
        started = self.n_done > self.n_cache
        return PromptProgress(
            req_id=self.req_id,
            total=len(self.prompt),
            cache=self.n_cache,
            processed=self.n_done,
            time_ms=(time.perf_counter() - self.t_start) * 1e3 if started else 0.0,
            timings=self.timings() if self.request.timings_per_token else None,
        )

    def prompt_done(self) -> None:
        self.t_prompt_end = time.perf_counter()

    # -- generation ----------------------------------------------------------------------

    def accept_token(
        self,
        token: int,
        piece: bytes,
        is_eog: bool,
        n_ctx_used: int,
        n_ctx_slot: int,
        id_slot: int,
        probs: TokenProbs | None,
    ) -> TokenEvent | None:
        """Apply one sampled token; returns the stream event (None when not streaming)."""
        now = time.perf_counter()
        self.t_last = now
        self.generated.append(token)
        req = self.request
        if probs is not None and req.post_sampling_probs:
            # The chain's candidates after sampling, as llama-server (the engine computed the
            # pre-sampling distribution).
            probs = self.sampler.post_sampling_probs(token, req.n_probs) or probs
        if probs is not None:
            self.probs.append(probs)
        delta = ""
        if is_eog:
            self.stop_type = StopType.EOS
        else:
            delta = self.text.feed(piece)
            if self.text.stopped:
                self.stop_type = StopType.WORD
        if self.stop_type is StopType.NONE:
            if req.n_predict >= 0 and len(self.generated) >= req.n_predict:
                self.stop_type = StopType.LIMIT
            elif n_ctx_used + 1 >= n_ctx_slot:
                # The next decode would need a cell past the slot's window.
                self.stop_type = StopType.LIMIT
            elif (
                req.t_max_predict_ms > 0 and (now - self.t_prompt_end) * 1e3 >= req.t_max_predict_ms
            ):
                self.stop_type = StopType.LIMIT
        if self.stop_type is not StopType.NONE:
            self.finished = True
            delta += self.text.finish()
        else:
            self.pending = token
        if not req.stream:
            return None
        return TokenEvent(
            req_id=self.req_id,
            id_slot=id_slot,
            text=delta,
            tokens=(token,),
            n_decoded=len(self.generated),
            n_prompt_tokens=len(self.prompt),
            probs=(probs,) if probs is not None else (),
            timings=self.timings() if req.timings_per_token else None,
        )

    def timings(self) -> Timings:
        t_prompt_end = self.t_prompt_end or time.perf_counter()
        return Timings(
            cache_n=self.n_cache,
            prompt_n=self.n_done - self.n_cache,
            # No prompt token evaluated yet (the admission's progress event): no prompt time.
            prompt_ms=(t_prompt_end - self.t_start) * 1e3 if self.n_done > self.n_cache else 0.0,
            predicted_n=len(self.generated),
            predicted_ms=max(0.0, self.t_last - self.t_prompt_end) * 1e3 if self.generated else 0.0,
            speculative=self.spec.enabled,
            draft_n=self.spec.draft_n,
            draft_n_accepted=self.spec.draft_n_accepted,
            draft_prompt_n=self.spec.draft_prompt_n,
        )

    def completion(self, id_slot: int, n_tokens_cached: int) -> Completion:
        if not self.text.finished:
            self.text.finish()
        return Completion(
            req_id=self.req_id,
            id_slot=id_slot,
            content=self.text.content,
            tokens=tuple(self.generated),
            n_decoded=len(self.generated),
            n_prompt_tokens=len(self.prompt),
            n_tokens_cached=n_tokens_cached,
            stop_type=self.stop_type,
            stopping_word=self.text.stopping_word,
            timings=self.timings(),
            seed=self.sampler.seed,
            sampling=self.request.sampling,
            n_predict=self.request.n_predict,
            probs=tuple(self.probs),
            cancelled=self.cancelled,
            served=self.served,
        )

    def close(self) -> None:
        self.sampler.close()
