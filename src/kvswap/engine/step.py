"""One engine step: plan it, place the plan's spans into the batch, decode, then verify drafts
and sample.

`Stepper.plan()` picks the step's LoRA set (libllama applies adapters per context, so a step runs
the slots of one set; sets take turns), has the speculator draft for its decoding slots, and asks
the pure planner for the batch; `replan(n_cells)` holds that batch to the KV cells still free.
`Stepper.run(plan, lora, frozen)` returns a `StepOutcome` that the engine applies: the slots
whose request finished (with an error when it failed), and whether the KV pool was full. Step
code never calls back into the engine and never ends a request itself; it streams token events
to the requests' sinks as it samples.

A decode that fails is undone on every slot of the batch (tokens, prompt progress and the
pending token put back; memory that cannot be cut is rolled back to its snapshot, or the request
fails), so the step can be retried once the engine has made room.

Engine thread only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from kvswap.backend.vocab import Vocab
from kvswap.core.errors import ErrorKind
from kvswap.core.types import EngineError, LoraSet
from kvswap.engine.metrics import EngineMetrics
from kvswap.engine.plan.lora import SetTurns
from kvswap.engine.plan.planner import SlotWork, Span, StepPlan, plan_step
from kvswap.engine.probs import top_probs
from kvswap.engine.running import RunningRequest
from kvswap.engine.runtime import Runtime
from kvswap.engine.slot import Slot, SlotTable
from kvswap.engine.spec.accept import judge, more
from kvswap.engine.spec.speculate import Speculator, rollback, take_rollback

log = logging.getLogger("kvswap.engine")


@dataclass
class StepOutcome:
    """What a step leaves for the engine to apply."""

    # Slot id -> None (the request finished) or the error it failed with, in finishing order.
    finished: dict[int, EngineError | None] = field(default_factory=dict)
    # The KV pool had no room: the step was undone on `retry` (slots still running), which the
    # engine retries after making room, or refuses one of.
    kv_full: bool = False
    retry: list[Slot] = field(default_factory=list)

    def finish(self, slot: Slot, error: EngineError | None = None) -> None:
        self.finished.setdefault(slot.id, error)


@dataclass
class _Placed:
    """One span of the current batch, kept to commit or roll back the step."""

    slot: Slot
    run: RunningRequest
    span: Span
    pos0: int
    token: int  # the decoded token of a decode span (for rollback)
    draft: list[int]  # draft tokens decoded after `token`, to verify
    rollback: bytearray | None = None  # partial snapshot before a draft (uncuttable memory)


class Stepper:
    """Runs steps on the runtime's context (see the module docstring)."""

    def __init__(
        self,
        *,
        runtime: Runtime,
        slots: SlotTable,
        vocab: Vocab,
        metrics: EngineMetrics,
        spec: Speculator | None,
    ) -> None:
        self.runtime = runtime
        self.slots = slots
        self.vocab = vocab
        self.metrics = metrics
        self.spec = spec
        self._turns = SetTurns()  # which LoRA set each step runs
        self._lora: LoraSet = ()  # the set of the last step planned
        self._work: list[SlotWork] = []  # what the last step planned had to compute

    def plan(self) -> tuple[StepPlan, LoraSet]:
        """The next step's batch plan and the LoRA set it runs under."""
        busy = [(s, s.running) for s in self.slots.busy() if s.running is not None]
        if busy:
            self._lora = self._turns.pick(s.lora for s, _ in busy)
        stepping = [(s, run) for s, run in busy if s.lora == self._lora]
        if self.spec is not None:
            # Only this step's slots draft (the draft context runs no adapters).
            self.spec.prepare([s for s, _ in stepping], self.runtime.n_ctx_slot)
        self._work = [
            SlotWork(
                slot_id=s.id,
                n_decode=1 + len(run.draft) if run.pending is not None else 0,
                n_prompt_left=run.n_prompt_left,
                admitted=run.admitted,
                chunk_limit=run.chunk_limit(),
            )
            for s, run in stepping
        ]
        return plan_step(self._work, self.runtime.step_budget), self._lora

    def replan(self, n_cells: int) -> StepPlan:
        """The step `plan` planned, held to `n_cells` free KV cells (no drafting again)."""
        return plan_step(self._work, self.runtime.step_budget, n_cells)

    def run(self, plan: StepPlan, lora: LoraSet, frozen: set[int]) -> StepOutcome:
        """Decode `plan` under LoRA set `lora`; `frozen` slots (mid-capture) keep their
        checkpoints."""
        rt = self.runtime
        placed = self._place(plan, frozen)
        rt.apply_lora(lora)
        t0 = time.perf_counter()
        rc = rt.ctx.decode(rt.batch)
        dt = time.perf_counter() - t0
        outcome = StepOutcome()
        if rc != 0:
            self._undo(rc, placed, outcome)
            return outcome
        self.metrics.on_decode(
            n_busy_slots=len(self.slots.busy()),
            n_prompt_tokens=plan.n_prompt_tokens,
            seconds=dt,
            max_tokens=max(len(p.slot.tokens) for p in placed),
        )
        if self.spec is not None:
            self.spec.after_prefill([p.slot for p in placed if not p.span.is_decode])
        redecode: list[_Placed] = []
        for p in placed:
            run = p.run
            if p.draft:
                if self._verify(p, outcome):
                    redecode.append(p)
            elif p.span.is_decode or p.span.ends_prompt:
                if p.span.ends_prompt:
                    run.prompt_done()
                    if run.request.return_progress and run.request.stream:
                        run.sink(run.progress())
                self._sample_row(p.slot, run, run.out_index, len(p.slot.tokens))
                if run.finished:
                    outcome.finish(p.slot)
            elif run.request.return_progress and run.request.stream:
                run.sink(run.progress())
        if redecode:
            self._redecode(redecode, outcome)
        return outcome

    # -- placing ----------------------------------------------------------------------------

    def _place(self, plan: StepPlan, frozen: set[int]) -> list[_Placed]:
        rt = self.runtime
        batch = rt.batch
        batch.clear()
        placed: list[_Placed] = []
        for span in plan.spans:
            slot = self.slots[span.slot_id]
            run = slot.running
            assert run is not None
            pos0 = len(slot.tokens)
            draft: list[int] = []
            snapshot = None
            if span.is_decode:
                assert run.pending is not None
                token = run.pending
                draft, run.draft = run.draft, []
                toks = np.array([token, *draft], dtype=np.int32)
                run.pending = None
                if draft and rt.memory.needs_checkpoints:
                    snapshot = take_rollback(rt.ctx, slot.seq_id)
                    if snapshot is None:  # cannot roll back: verify no draft this step
                        toks, draft = toks[:1], []
                run.out_index = batch.add_outputs(toks, pos0, slot.seq_id)
            else:
                token = -1
                if run.checkpoint_due(pos0):
                    # The slot as it stands before this chunk; slots mid-capture keep theirs.
                    rt.memory.capture(slot, frozen=frozen)
                toks = run.prompt[run.n_done : run.n_done + span.n_tokens]
                idx = batch.add_span(toks, pos0, slot.seq_id, span.ends_prompt)
                run.out_index = idx if span.ends_prompt else -1
                run.n_done += span.n_tokens
            slot.tokens.append(toks)
            placed.append(_Placed(slot, run, span, pos0, token, draft, snapshot))
        return placed

    # -- committing -------------------------------------------------------------------------

    def _sample_row(self, slot: Slot, run: RunningRequest, row: int, n_ctx_used: int) -> int:
        """Sample batch output `row` for the request and apply the token (stream it)."""
        ctx = self.runtime.ctx
        token = run.sampler.sample(ctx, row)
        probs = None
        if run.request.n_probs > 0:
            probs = top_probs(ctx.logits(row), token, run.request.n_probs, self.vocab.piece)
        event = run.accept_token(
            token,
            self.vocab.piece(token),
            self.vocab.is_eog(token),
            n_ctx_used,
            self.runtime.n_ctx_slot,
            slot.id,
            probs,
        )
        if event is not None:
            run.sink(event)
        return token

    def _verify(self, p: _Placed, outcome: StepOutcome) -> bool:
        """Sample the draft's rows while the target agrees (`spec.accept`), keep the KV of the
        accepted tokens only. True when a rollback snapshot must be restored and the accepted
        tokens re-decoded (after every row of this batch is read)."""
        assert self.spec is not None
        slot, run, draft = p.slot, p.run, p.draft
        sampled: list[int] = []
        while not sampled or more(draft, sampled, run.finished):
            i = len(sampled)
            sampled.append(self._sample_row(slot, run, run.out_index + i, p.pos0 + 1 + i))
        verdict = judge(draft, sampled)
        self.spec.on_verified(run, len(draft), verdict.n_matched)
        keep = p.pos0 + 1 + verdict.n_accepted
        must_redecode = False
        if keep < len(slot.tokens):
            if p.rollback is None:
                self.runtime.ctx.seq_rm(slot.seq_id, keep, -1)
            else:
                must_redecode = True
            slot.tokens.truncate(keep)
        if run.finished:
            outcome.finish(slot)
        return must_redecode

    def _redecode(self, placed: list[_Placed], outcome: StepOutcome) -> None:
        """Memory that cannot be cut: back to the snapshot, then decode the accepted tokens."""
        rt = self.runtime
        batch = rt.batch
        batch.clear()
        ok: list[_Placed] = []
        for p in placed:
            assert p.rollback is not None
            if rollback(rt.ctx, p.slot.seq_id, p.rollback, p.pos0):
                batch.add_span(p.slot.tokens.view()[p.pos0 :], p.pos0, p.slot.seq_id, False)
                ok.append(p)
            else:
                self._lose(p, "the slot could not be rolled back after a draft", outcome)
        if ok and rt.ctx.decode(batch) != 0:
            for p in ok:
                self._lose(p, "the slot could not be re-decoded after a draft", outcome)

    def _lose(self, p: _Placed, message: str, outcome: StepOutcome) -> None:
        """Clear a slot whose KV no longer matches its tokens; its request fails (unless it
        already finished)."""
        log.error("slot %d: %s", p.slot.id, message)
        self.runtime.verbs.clear(p.slot)
        outcome.finish(p.slot, EngineError(p.run.req_id, ErrorKind.SERVER, message))

    # -- a failed decode --------------------------------------------------------------------

    def _undo(self, rc: int, placed: list[_Placed], outcome: StepOutcome) -> None:
        """Undo the step on every slot in the batch; the requests that cannot go on fail."""
        rt = self.runtime
        for p in placed:
            run = p.run
            if p.rollback is not None and rollback(rt.ctx, p.slot.seq_id, p.rollback, p.pos0):
                # Memory that cannot be cut: the snapshot taken before the draft puts it back.
                p.slot.tokens.truncate(p.pos0)
                kept = p.pos0
            else:
                kept = rt.memory.cut(p.slot, p.pos0)
            if p.span.is_decode:
                run.pending = p.token
            else:
                run.n_done -= p.span.n_tokens
            if kept < p.pos0:
                # The memory could not be cut back (recurrent state): the request cannot go on.
                message = "decode failed and the slot could not be restored"
                outcome.finish(p.slot, EngineError(run.req_id, ErrorKind.SERVER, message))
        going_on = [p.slot for p in placed if p.slot.id not in outcome.finished]
        if rc == 1:
            outcome.kv_full, outcome.retry = bool(going_on), going_on
            return
        log.error("llama_decode failed with %d", rc)
        for slot in going_on:
            req_id = slot.running.req_id if slot.running is not None else -1
            outcome.finish(
                slot, EngineError(req_id, ErrorKind.SERVER, f"llama_decode failed ({rc})")
            )
