"""Speculative decoding: which draft each decoding slot sends to the target, and the counters.

Owns the speculative configuration (`SpecConfig`), the draft context when the type is
`draft-simple` (`draft.DraftContext`, rebuilt with the target's geometry), the draft-model
compatibility check, and the per-request and server-wide draft counters. The engine calls
`prepare` before planning a step (each decoding slot gets `run.draft`), `after_prefill` after a
step that decoded prompt chunks (the draft mirrors them at the same positions), and `on_verified`
once the target has judged a draft; verification itself is the engine's commit.

Where the target's memory cannot be cut back (recurrent, hybrid, sliding window), the engine
takes `take_rollback` before a verification batch and `rollback`s it on rejection, then
re-decodes the accepted tokens. These snapshots are not context checkpoints: never counted.

Engine thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvswap.backend.context import FLAGS_PARTIAL_ONLY, Context, ContextParams
from kvswap.backend.model import Model
from kvswap.engine.spec.draft import DraftContext, DraftJob
from kvswap.engine.spec.ngram import ngram_simple_draft

if TYPE_CHECKING:
    from kvswap.engine.running import RunningRequest
    from kvswap.engine.slot import Slot

log = logging.getLogger("kvswap.spec")

DRAFT_SIMPLE = "draft-simple"
NGRAM_SIMPLE = "ngram-simple"

# llama.cpp's compatibility rules for a draft model (common_speculative_are_compatible).
_VOCAB_MAX_SIZE_DIFFERENCE = 128
_VOCAB_CHECK_START_TOKEN = 5


class DraftModelError(ValueError):
    """The draft model cannot draft for the target (vocabulary mismatch)."""


@dataclass(frozen=True)
class SpecConfig:
    """The speculative slice of the server configuration."""

    spec_type: str  # DRAFT_SIMPLE or NGRAM_SIMPLE
    n_max: int = 3  # --spec-draft-n-max (draft-simple)
    n_min: int = 0  # --spec-draft-n-min: shorter drafts are dropped
    p_min: float = 0.0  # --spec-draft-p-min: drafting stops below this probability
    ngram_size_n: int = 12  # --spec-ngram-simple-size-n
    ngram_size_m: int = 48  # --spec-ngram-simple-size-m: ngram-simple's longest draft
    cache_type_k_draft: str = "f16"
    cache_type_v_draft: str = "f16"
    n_threads_draft: int = 1
    n_threads_batch_draft: int = 1

    @property
    def n_max_draft(self) -> int:
        """The longest draft this type makes (llama-server's common_speculative_n_max)."""
        return self.ngram_size_m if self.spec_type == NGRAM_SIMPLE else max(0, self.n_max)


def check_compatible(target: Model, draft: Model) -> None:
    """Refuse a draft whose vocabulary differs from the target's (typed DraftModelError)."""
    tv, dv = target.vocab, draft.vocab
    if target.info.vocab_type != draft.info.vocab_type:
        raise DraftModelError("the draft model's vocabulary type differs from the target's")
    if (tv.add_bos, tv.bos, tv.add_eos, tv.eos) != (dv.add_bos, dv.bos, dv.add_eos, dv.eos):
        raise DraftModelError("the draft model's BOS/EOS tokens differ from the target's")
    if abs(tv.n_tokens - dv.n_tokens) > _VOCAB_MAX_SIZE_DIFFERENCE:
        raise DraftModelError(
            f"the draft model's vocabulary has {dv.n_tokens} tokens, the target's "
            f"{tv.n_tokens} (at most {_VOCAB_MAX_SIZE_DIFFERENCE} apart)"
        )
    for tok in range(_VOCAB_CHECK_START_TOKEN, min(tv.n_tokens, dv.n_tokens)):
        if tv.token_text(tok) != dv.token_text(tok):
            raise DraftModelError(f"the draft model's token {tok} differs from the target's")


def take_rollback(ctx: Context, seq_id: int) -> bytearray | None:
    """A partial snapshot of a sequence that cannot be cut (None when libllama cannot copy)."""
    size = ctx.state_size(seq_id, FLAGS_PARTIAL_ONLY)
    data = bytearray(size)
    return data if ctx.state_get_into(seq_id, data, FLAGS_PARTIAL_ONLY) == size else None


def rollback(ctx: Context, seq_id: int, data: bytearray, n_tokens: int) -> bool:
    """Back to the snapshot taken at `n_tokens`: restore first, then cut the tail (the order
    that keeps hybrids exact)."""
    return ctx.state_set_from(seq_id, data, FLAGS_PARTIAL_ONLY) and ctx.seq_rm(seq_id, n_tokens, -1)


class Speculator:
    """Drafts for decoding slots (see the module docstring)."""

    def __init__(self, config: SpecConfig, draft_model: Model | None) -> None:
        if config.spec_type == DRAFT_SIMPLE and draft_model is None:
            raise DraftModelError("draft-simple needs a draft model")
        self.config = config
        self.draft_model = draft_model if config.spec_type == DRAFT_SIMPLE else None
        self.draft: DraftContext | None = None
        self.per_slot_cap = config.n_max_draft
        self.n_drafts_total = 0
        self.n_draft_tokens_total = 0
        self.n_accepted_tokens_total = 0

    # -- the draft context follows the target's geometry ------------------------------------

    def install(self, target: ContextParams, n_batch_capacity: int) -> None:
        """Build the draft context for the target's geometry (n_seq_max = n_parallel)."""
        # Every decoding slot sends 1 + its draft: cap the draft so one step fits the batch.
        n_seq = target.n_seq_max
        self.per_slot_cap = max(0, min(self.config.n_max_draft, n_batch_capacity // n_seq - 1))
        if self.draft_model is None:
            return
        c = self.config
        self.draft = DraftContext(
            self.draft_model,
            ContextParams(
                n_ctx=target.n_ctx,
                n_seq_max=n_seq,
                n_batch=target.n_batch,
                n_ubatch=target.n_ubatch,
                kv_unified=target.kv_unified,
                cache_type_k=c.cache_type_k_draft,
                cache_type_v=c.cache_type_v_draft,
                n_threads=c.n_threads_draft,
                n_threads_batch=c.n_threads_batch_draft,
                flash_attn=target.flash_attn,
                swa_full=target.swa_full,
            ),
        )

    def uninstall(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    # -- drafting ---------------------------------------------------------------------------

    def _n_max(self, run: RunningRequest, n_tokens: int, n_ctx_slot: int) -> int:
        """The longest draft that fits the slot's window and the request's n_predict."""
        n = min(self.per_slot_cap, n_ctx_slot - n_tokens - 2)
        if run.request.n_predict >= 0:
            n = min(n, run.request.n_predict - len(run.generated) - 1)
        return n

    def prepare(self, slots: list[Slot], n_ctx_slot: int) -> None:
        """Give each decoding slot its draft for this step (`run.draft`, maybe empty)."""
        jobs: list[DraftJob] = []
        runs: dict[int, RunningRequest] = {}
        for slot in slots:
            run = slot.running
            if run is None or run.pending is None:
                continue
            run.draft = []
            n_max = self._n_max(run, len(slot.tokens), n_ctx_slot)
            if n_max <= 0:
                continue
            history = slot.tokens.view()
            if self.config.spec_type == NGRAM_SIMPLE:
                c = self.config
                run.draft = ngram_simple_draft(history, run.pending, c.ngram_size_n, c.ngram_size_m)
                del run.draft[n_max:]
            else:
                tokens = np.append(history, np.int32(run.pending)).astype(np.int32)
                jobs.append(DraftJob(slot.id, tokens, n_max))
                runs[slot.id] = run
        if not jobs:
            return
        assert self.draft is not None
        for slot_id, result in self.draft.draft(jobs, self.config.p_min, self.config.n_min).items():
            run = runs[slot_id]
            run.draft = result.tokens
            run.spec.draft_prompt_n += max(0, len(run.prompt) - result.n_kept)

    def after_prefill(self, slots: list[Slot]) -> None:
        """The draft model takes the prompt chunks the target just decoded."""
        if self.draft is None or not slots:
            return
        kept = self.draft.sync([(s.id, s.tokens.view()) for s in slots])
        for slot in slots:
            run = slot.running
            if run is not None:
                run.spec.draft_prompt_n += max(0, len(slot.tokens) - kept[slot.id])

    def on_verified(self, run: RunningRequest, n_draft: int, n_accepted: int) -> None:
        run.spec.draft_n += n_draft
        run.spec.draft_n_accepted += n_accepted
        self.n_drafts_total += 1
        self.n_draft_tokens_total += n_draft
        self.n_accepted_tokens_total += n_accepted
