"""The engine thread: the only caller of libllama for contexts, slots and samplers.

One loop, one step at a time: drain commands, start waiting work on idle slots, plan (pure),
decode one batch, commit (sample, stream events, finish requests), publish a snapshot. HTTP
handlers reach it only through `EngineClient`, which posts commands to `inbox`.

Owns the context, the batch, the slots and their requests' sampler chains. Does no file I/O:
slot files are read and written by workers around `SlotCapture` and `SlotApply`.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model
from kvswap.backend.sampler import SamplerChain
from kvswap.engine.anoncache import AnonCache
from kvswap.engine.buffers import BufferReady, BufferWorker, new_buffer
from kvswap.engine.checkpoints import CheckpointBudget
from kvswap.engine.commands import (
    Cancel,
    Command,
    FlushMinds,
    Nudge,
    PageIn,
    PageMoved,
    PageOut,
    Reconfigure,
    Shutdown,
    SlotApply,
    SlotCapture,
    SlotErase,
    SlotVerb,
    Submit,
)
from kvswap.engine.geometry import Geometry
from kvswap.engine.lora import LoraSet, SetTurns, resolve
from kvswap.engine.memory import SlotMemory
from kvswap.engine.metrics import EngineMetrics
from kvswap.engine.minds import MindRegistry
from kvswap.engine.mindslots import SPARE_TAG, MindSlots, NoRoomYet
from kvswap.engine.pagefmt import PageGeometry, read_tokens
from kvswap.engine.pagestore import PageStore
from kvswap.engine.planner import SlotWork, Span, StepPlan, plan_step
from kvswap.engine.probs import top_probs
from kvswap.engine.reconfigure import Reconfigurer
from kvswap.engine.running import RunningRequest
from kvswap.engine.scheduler import Job, WaitQueue
from kvswap.engine.slot import Slot
from kvswap.engine.slotstate import StateMover
from kvswap.engine.snapshot import EngineSnapshot, SlotSnapshot
from kvswap.engine.speculate import SpecConfig, Speculator, rollback, take_rollback
from kvswap.engine.types import (
    Completion,
    EngineError,
    ErrorKind,
    Event,
    GenerationRequest,
    KvswapError,
)
from kvswap.engine.verbs import PageCounters, PendingCapture, SlotVerbs

log = logging.getLogger("kvswap.engine")


def _no_reply(_: object) -> None:
    """The reply of a verb the engine runs for itself."""


# While slots are busy, the snapshot read by /slots and /metrics is refreshed at most this often.
_SNAPSHOT_EVERY_S = 0.05


@dataclass(frozen=True)
class EngineConfig:
    """The engine's slice of the server configuration."""

    geometry: Geometry
    n_threads: int = 1
    n_threads_batch: int = 1
    flash_attn: str = "auto"
    swa_full: bool = False
    slot_prompt_similarity: float = 0.1
    step_tokens: int = 0  # per-step token budget; 0 = n_ubatch
    ctx_checkpoints: int = 32  # per slot (--ctx-checkpoints)
    checkpoint_min_step: int = 8192  # tokens between spaced checkpoints; 0 = only near the end
    ctx_checkpoints_bytes: int = 0  # one byte budget over all slots; 0 = off
    spec: SpecConfig | None = None  # speculative decoding; None = off
    cache_ram_bytes: int = 0  # anonymous prompt cache (--cache-ram); 0 = off, -1 = no limit
    cache_idle_slots: bool = True  # --cache-idle-slots: a start saves (and clears) idle slots


@dataclass
class _Placed:
    """One span of the current batch, kept to commit or roll back the step."""

    slot: Slot
    span: Span
    pos0: int
    token: int  # the decoded token of a decode span (for rollback)
    draft: list[int]  # draft tokens decoded after `token`, to verify
    rollback: bytearray | None = None  # partial snapshot before a draft (uncuttable memory)


class Engine:
    """Runs requests on a model's context in a thread of its own."""

    def __init__(
        self,
        model: Model,
        config: EngineConfig,
        page_ram_bytes: int = 0,
        adapters: Adapters | None = None,
        draft_model: Model | None = None,
    ) -> None:
        self.model = model
        # LoRA adapters (owned by the loader): a step batches only slots of one set.
        self.adapters = adapters if adapters is not None else Adapters()
        self._turns = SetTurns()  # which set each step runs
        self._lora_step: LoraSet = ()  # the set of the step being planned
        self.spec = Speculator(config.spec, draft_model) if config.spec is not None else None
        self.vocab = model.vocab
        self.config = config
        self.waiting = WaitQueue(config.slot_prompt_similarity)
        self.metrics = EngineMetrics()
        self._n_admitted = 0
        self._last_run: dict[int, RunningRequest] = {}  # slot id -> its last request (for /slots)
        self._swa_window = 0 if config.swa_full else model.info.n_swa
        self.inbox: queue.SimpleQueue[Command | BufferReady] = queue.SimpleQueue()
        self.buffers = BufferWorker(self.inbox.put)
        self.store = PageStore(page_ram_bytes, self.buffers.dispose) if page_ram_bytes > 0 else None
        self._pending: dict[int, PendingCapture] = {}  # captures waiting for their buffer
        self._tags = itertools.count(1)
        self.budget = CheckpointBudget(config.ctx_checkpoints, config.ctx_checkpoints_bytes)
        self.page_counters = PageCounters()
        self.minds = MindRegistry()
        self.anon = AnonCache(self, config.cache_ram_bytes)
        self.mind_slots = MindSlots(self, self.minds)
        self.geometry = config.geometry
        # Tests inject a context-build failure into a reconfigure (the rollback path).
        self.fault_on_install = os.environ.get("KVSWAP_FAULT_RECONFIGURE") == "1"
        self.reconfigurer = Reconfigurer(self)
        self.crashed: str | None = None  # set when the loop died: every command then fails

        self._install(self.geometry)
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(self.geometry.n_parallel)]
        self._thread: threading.Thread | None = None
        self.snapshot = self._make_snapshot()
        self._t_snapshot = 0.0

    def _install(self, geo: Geometry) -> None:
        """Build the context and everything bound to it for `geo` (weights stay loaded).

        Raises ContextInitError when libllama cannot build it; nothing is changed then."""
        config, info = self.config, self.model.info
        params = ContextParams(
            n_ctx=geo.n_ctx,
            n_seq_max=geo.n_parallel,
            n_batch=geo.n_batch,
            n_ubatch=geo.n_ubatch,
            kv_unified=geo.kv_unified,
            cache_type_k=geo.cache_type_k,
            cache_type_v=geo.cache_type_v,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads_batch,
            flash_attn=config.flash_attn,
            swa_full=config.swa_full,
        )
        ctx = Context(self.model, params)
        if self.spec is not None:
            try:
                self.spec.install(params, geo.n_batch)
            except BaseException:
                ctx.close()
                raise
        self.ctx = ctx
        self._lora_applied: LoraSet | None = None  # a new context starts without adapters
        self.n_ctx_slot = min(ctx.n_ctx_seq, info.n_ctx_train)
        if geo.kv_unified_per_slot > 0:
            self.n_ctx_slot = min(self.n_ctx_slot, geo.kv_unified_per_slot)
        self.step_budget = max(1, min(config.step_tokens or geo.n_ubatch, geo.n_batch))
        n_spec = 1 + self.spec.per_slot_cap if self.spec is not None else 1
        self.batch = Batch(max(self.step_budget, geo.n_parallel * n_spec))
        self.page_geometry = PageGeometry(
            model_fingerprint=info.fingerprint,
            cache_type_k=geo.cache_type_k,
            cache_type_v=geo.cache_type_v,
            n_stream=1 if geo.kv_unified else geo.n_parallel,
            n_ctx_slot=self.n_ctx_slot,
        )
        self.memory = SlotMemory(
            ctx,
            needs_checkpoints=info.is_recurrent or info.is_hybrid or self._swa_window > 0,
            swa_window=self._swa_window,
            budget=self.budget,
            n_ubatch=geo.n_ubatch,
            min_step=config.checkpoint_min_step,
        )
        mover = StateMover(
            ctx,
            self.memory,
            self.page_geometry,
            self.vocab.n_tokens,
            self.n_ctx_slot,
            self.adapters.infos,
            draft=self.spec.draft if self.spec is not None else None,
        )
        self.verbs = SlotVerbs(ctx, mover, self.store, self.page_counters)

    def _uninstall(self) -> None:
        """Free the context and what is bound to it (the weights stay)."""
        self.batch.close()
        if self.spec is not None:
            self.spec.uninstall()
        self.ctx.close()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvswap-engine", daemon=True)
        self._thread.start()

    def post(self, cmd: Command | BufferReady) -> None:
        self.inbox.put(cmd)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self.inbox.put(Shutdown())
            self._thread.join(timeout_s)
            self._thread = None

    def close(self) -> None:
        self.stop()
        self.mind_slots.close()
        if self.store is not None:
            self.store.close()
        self.buffers.close()
        self._uninstall()

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._drain(block=not self._busy()):
                self._start_waiting()
                plan = self._plan()
                if plan.spans:
                    self._step(plan)
                self.reconfigurer.tick()
                # The step or the tick may have freed a slot that queued work waits for: start
                # it now, or the next drain would sleep on the inbox with that work stranded.
                self._start_waiting()
                now = time.monotonic()
                if not self._busy() or now - self._t_snapshot >= _SNAPSHOT_EVERY_S:
                    self.snapshot = self._make_snapshot()
                    self._t_snapshot = now
        except Exception as err:
            log.exception("engine loop crashed")
            self.crashed = f"the engine stopped after an internal error ({type(err).__name__})"
            self._fail_everything(ErrorKind.SERVER, self.crashed)
            self.snapshot = self._make_snapshot()
            self._refuse_forever(self.crashed)
            return
        self._fail_everything(ErrorKind.UNAVAILABLE, "the server is shutting down")

    def _refuse_forever(self, message: str) -> None:
        """After a crash: answer every command with a typed 500 until shutdown (no hang)."""
        while True:
            cmd = self.inbox.get()
            if isinstance(cmd, Shutdown):
                return
            if isinstance(cmd, Submit):
                cmd.sink(EngineError(cmd.req_id, ErrorKind.SERVER, message))
            elif isinstance(cmd, BufferReady):
                if cmd.buffer is not None:
                    cmd.buffer.close()
            elif isinstance(cmd, Nudge):
                if cmd.reply is not None:
                    cmd.reply(None)
            elif not isinstance(cmd, Cancel):
                cmd.reply(KvswapError(ErrorKind.SERVER, message))

    def _busy(self) -> bool:
        return (
            any(s.running is not None for s in self.slots) or not self.reconfigurer.admission_open
        )

    def _drain(self, block: bool) -> bool:
        """Handle queued commands; False once asked to shut down."""
        try:
            cmd = self.inbox.get() if block else self.inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, Shutdown):
                return False
            self._handle(cmd)
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                return True

    def _handle(self, cmd: Command | BufferReady) -> None:
        if isinstance(cmd, Submit):
            err = self._check_submit(cmd)
            if err is not None:
                cmd.sink(err)
                return
            prompt = np.asarray(cmd.request.prompt_tokens, dtype=np.int32)
            mind = cmd.request.mind
            slot_id = -1 if mind else cmd.request.id_slot  # a mind's slot is where it lives
            self.waiting.add(
                Job(cmd.req_id, slot_id, prompt, cmd, mind=mind, lora=cmd.request.lora)
            )
        elif isinstance(cmd, Cancel):
            self._cancel(cmd.req_id)
        elif isinstance(cmd, BufferReady):
            self._buffer_ready(cmd)
        elif isinstance(cmd, Reconfigure):
            self.reconfigurer.submit(cmd)
        elif isinstance(cmd, Nudge):
            if cmd.reply is not None:
                cmd.reply(None)
        elif isinstance(cmd, FlushMinds):
            try:
                cmd.reply(self.mind_slots.flush())
            except KvswapError as err:
                cmd.reply(err)
        elif isinstance(cmd, SlotCapture | SlotApply | SlotErase | PageOut | PageIn):
            if not 0 <= cmd.slot_id < len(self.slots):
                cmd.reply(KvswapError(ErrorKind.INVALID_REQUEST, "Invalid slot ID"))
                return
            self.waiting.add(Job(cmd.req_id, cmd.slot_id, None, cmd))

    def _check_submit(self, cmd: Submit) -> EngineError | None:
        req = cmd.request
        n = len(req.prompt_tokens)
        if not -1 <= req.id_slot < len(self.slots):
            return EngineError(
                cmd.req_id, ErrorKind.INVALID_REQUEST, f"Invalid slot ID: {req.id_slot}"
            )
        if n == 0:
            return EngineError(cmd.req_id, ErrorKind.INVALID_REQUEST, "the prompt is empty")
        if n >= self.n_ctx_slot:
            return EngineError(
                cmd.req_id,
                ErrorKind.EXCEED_CONTEXT,
                f"request ({n} tokens) exceeds the available context size ({self.n_ctx_slot} "
                "tokens), try increasing it",
                {"n_prompt_tokens": n, "n_ctx": self.n_ctx_slot},
            )
        if any(not 0 <= i < len(self.adapters) for i, _ in req.lora):
            return EngineError(cmd.req_id, ErrorKind.INVALID_REQUEST, "unknown LoRA adapter id")
        bad = [t for t in req.prompt_tokens if not self.vocab.valid(t)]
        if bad:
            return EngineError(
                cmd.req_id, ErrorKind.INVALID_REQUEST, f"invalid token id in prompt: {bad[0]}"
            )
        return None

    # -- admission --------------------------------------------------------------------------

    def _start_waiting(self) -> None:
        if not self.reconfigurer.admission_open:
            return  # a reconfigure waits for seats: arriving work queues
        for job, slot in self.waiting.startable(self.slots):
            cmd = job.payload
            try:
                self.mind_slots.seat(slot, cmd)
            except NoRoomYet:
                self.waiting.jobs.insert(0, job)  # retried when the demoter has made room
                break
            except KvswapError as err:
                self._fail_job(cmd, err)
                continue
            if isinstance(cmd, Submit):
                assert job.prompt is not None
                self._admit(cmd, job.prompt, slot)
            elif isinstance(cmd, SlotCapture | SlotApply | SlotErase | PageOut | PageIn):
                self._run_verb(cmd, slot)

    def _fail_job(self, cmd: object, err: KvswapError) -> None:
        if isinstance(cmd, Submit):
            cmd.sink(EngineError(cmd.req_id, err.kind, err.message))
        elif isinstance(cmd, SlotCapture | SlotApply | SlotErase | PageOut | PageIn):
            cmd.reply(err)

    def _run_verb(self, cmd: SlotVerb, slot: Slot) -> None:
        try:
            if isinstance(cmd, PageOut | SlotCapture):
                pending = self.verbs.begin_capture(cmd, slot)
                tag = next(self._tags)
                self._pending[tag] = pending
                slot.locked = True
                self.buffers.allocate(pending.layout.n_bytes, tag)
                return
            result: object
            if isinstance(cmd, SlotApply):
                result = self.verbs.apply(cmd, slot)
            elif isinstance(cmd, SlotErase):
                result = self.verbs.erase(cmd, slot)
            elif self._token_only(cmd.name):
                self._reprefill_page(cmd, slot)
                return
            else:
                result = self.verbs.page_in(slot, cmd.name)

            slot.t_last_used = time.monotonic()
        except KvswapError as err:
            result = err
        cmd.reply(result)

    def _token_only(self, name: str) -> bool:
        if self.store is None:
            return False
        try:
            return self.store.get(name).layout.token_only
        except KvswapError:
            return False  # page_in answers the typed 404

    def _reprefill_page(self, cmd: PageIn, slot: Slot) -> None:
        """page_in of a page that holds tokens only (a KV type change dropped its state): the
        slot prefills them; the page leaves the store once they are in."""
        assert self.store is not None
        page = self.store.hold(cmd.name)
        with page.view() as view:
            tokens = read_tokens(view, page.layout)
        try:
            lora = resolve(page.layout.lora, self.adapters.infos, f"page {cmd.name!r}")
        except KvswapError as err:
            self.store.release(page)
            cmd.reply(err)
            return
        if len(tokens) >= self.n_ctx_slot:
            store_ = self.store
            store_.release(page)
            cmd.reply(
                KvswapError(
                    ErrorKind.INVALID_REQUEST,
                    f"page {cmd.name!r} holds {len(tokens)} tokens, more than a slot's window ({self.n_ctx_slot})",
                )
            )
            return
        t0 = time.perf_counter()

        n_discarded = len(slot.tokens)
        store = self.store

        def done(event: Event) -> None:
            if isinstance(event, Completion | EngineError):
                if isinstance(event, Completion):
                    store.remove(cmd.name, page.generation)
                    self.page_counters.page_in_total += 1
                    ms = (time.perf_counter() - t0) * 1e3
                    cmd.reply(PageMoved(slot.id, cmd.name, len(tokens), 0, 0, 0, ms, n_discarded))
                else:
                    self.page_counters.page_failed_total += 1
                    cmd.reply(KvswapError(event.kind, event.message))
                store.release(page)

        request = GenerationRequest(
            prompt_tokens=tuple(int(t) for t in tokens), n_predict=0, id_slot=slot.id, lora=lora
        )
        self._admit(Submit(cmd.req_id, request, done), np.asarray(tokens, dtype=np.int32), slot)

    def _buffer_ready(self, ready: BufferReady) -> None:
        """The second half of a capture: copy into the buffer that just arrived."""
        if ready.tag == SPARE_TAG:
            self.mind_slots.spare_ready(ready)
            return
        pending = self._pending.pop(ready.tag)
        pending.slot.locked = False
        result: object
        if ready.buffer is None:
            self.verbs.abandon(pending)
            result = KvswapError(ErrorKind.UNAVAILABLE, f"no memory for the copy: {ready.error}")
        else:
            try:
                result = self.verbs.finish_capture(pending, ready.buffer)
                pending.slot.t_last_used = time.monotonic()
            except KvswapError as err:
                result = err
        pending.cmd.reply(result)

    def _revalidate_waiting(self) -> None:
        """After a reconfigure: queued work that no longer fits the geometry fails, typed."""
        for job in list(self.waiting.jobs):
            cmd = job.payload
            if isinstance(cmd, Submit):
                err = self._check_submit(cmd)
                if err is not None:
                    self.waiting.remove(job.req_id)
                    cmd.sink(err)
            elif isinstance(cmd, SlotCapture | SlotApply | SlotErase | PageOut | PageIn) and not (
                0 <= cmd.slot_id < len(self.slots)
            ):
                self.waiting.remove(job.req_id)
                message = "Invalid slot ID (the geometry changed)"
                cmd.reply(KvswapError(ErrorKind.INVALID_REQUEST, message))

    def _admit(self, cmd: Submit, prompt: np.ndarray, slot: Slot) -> None:
        req = cmd.request
        # KV computed under one LoRA set never serves a request under another.
        same_lora = slot.lora == req.lora
        n_keep = slot.tokens.common_prefix(prompt) if req.cache_prompt and same_lora else 0
        n_keep = min(n_keep, len(prompt) - 1)  # at least one token is evaluated
        n_keep = self._truncate(slot, n_keep)
        slot.lora = req.lora
        sampler = SamplerChain(self.vocab, req.sampling, self.n_ctx_slot)
        for tok in prompt[max(0, len(prompt) - req.sampling.history_needed(self.n_ctx_slot)) :]:
            sampler.accept(int(tok))
        self._n_admitted += 1
        slot.running = RunningRequest(
            cmd.req_id, req, prompt, cmd.sink, sampler, n_keep, self._n_admitted
        )
        slot.running.checkpoint_at = self.memory.plan(len(prompt), n_keep)
        slot.running.spec.enabled = self.spec is not None
        if req.return_progress and req.stream:  # llama-server's 0% event, before any decode
            slot.running.sink(slot.running.progress())
        self.anon.cache_idle_slots(slot)
        self._last_run[slot.id] = slot.running
        self.metrics.on_prompt_cached(n_keep)

    def _truncate(self, slot: Slot, n: int) -> int:
        """Cut a slot's KV and tokens to at most the first `n` (a checkpoint, or 0, when the
        memory cannot be cut there); returns what is kept."""
        return self.memory.cut(slot, n)

    # -- one step ---------------------------------------------------------------------------

    def _plan(self) -> StepPlan:
        busy = [(s, s.running) for s in self.slots if s.running is not None]
        if busy:
            # libllama applies adapters per context: one LoRA set per step, sets take turns.
            self._lora_step = self._turns.pick(s.lora for s, _ in busy)
        stepping = [(s, run) for s, run in busy if s.lora == self._lora_step]
        if self.spec is not None:
            # Only this step's slots draft (the draft context runs no adapters).
            self.spec.prepare([s for s, _ in stepping], self.n_ctx_slot)

        work = [
            SlotWork(
                slot_id=s.id,
                n_decode=1 + len(run.draft) if run.pending is not None else 0,
                n_prompt_left=run.n_prompt_left,
                admitted=run.admitted,
                chunk_limit=run.chunk_limit(),
            )
            for s, run in stepping
        ]

        return plan_step(work, self.step_budget)

    def _step(self, plan: StepPlan) -> None:
        batch = self.batch
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
                if draft and self.memory.needs_checkpoints:
                    snapshot = take_rollback(self.ctx, slot.seq_id)
                    if snapshot is None:  # cannot roll back: verify no draft this step
                        toks, draft = toks[:1], []
                run.out_index = batch.add_outputs(toks, pos0, slot.seq_id)
            else:
                token = -1
                if run.checkpoint_due(pos0):
                    # The slot as it stands before this chunk; slots mid-capture keep theirs.
                    self.memory.capture(slot, frozen={p.slot.id for p in self._pending.values()})
                toks = run.prompt[run.n_done : run.n_done + span.n_tokens]
                idx = batch.add_span(toks, pos0, slot.seq_id, span.ends_prompt)
                run.out_index = idx if span.ends_prompt else -1
                run.n_done += span.n_tokens
            slot.tokens.append(toks)
            placed.append(_Placed(slot, span, pos0, token, draft, snapshot))
        if self._lora_step != self._lora_applied:
            self.adapters.apply(self.ctx, self._lora_step)
            self._lora_applied = self._lora_step
        t0 = time.perf_counter()
        rc = self.ctx.decode(batch)
        dt = time.perf_counter() - t0
        if rc != 0:
            self._on_decode_failure(rc, placed)
            return
        self.metrics.on_decode(
            n_busy_slots=sum(1 for s in self.slots if s.running is not None),
            n_prompt_tokens=plan.n_prompt_tokens,
            seconds=dt,
            max_tokens=max(len(p.slot.tokens) for p in placed),
        )
        if self.spec is not None:
            self.spec.after_prefill([p.slot for p in placed if not p.span.is_decode])
        redecode: list[_Placed] = []
        for p in placed:
            run = p.slot.running
            assert run is not None
            if p.draft:
                if self._verify(p):
                    redecode.append(p)
            elif p.span.is_decode or p.span.ends_prompt:
                if p.span.ends_prompt:
                    run.prompt_done()
                    if run.request.return_progress and run.request.stream:
                        run.sink(run.progress())
                self._sample(p.slot, run)
            elif run.request.return_progress and run.request.stream:
                run.sink(run.progress())
        if redecode:
            self._redecode(redecode)

    def _sample(self, slot: Slot, run: RunningRequest) -> None:
        self._sample_row(slot, run, run.out_index, len(slot.tokens))
        if run.finished:
            self._release(slot)

    def _sample_row(self, slot: Slot, run: RunningRequest, row: int, n_ctx_used: int) -> int:
        """Sample batch output `row` for the request and apply the token (stream it)."""
        token = run.sampler.sample(self.ctx, row)
        probs = None
        if run.request.n_probs > 0:
            probs = top_probs(self.ctx.logits(row), token, run.request.n_probs, self.vocab.piece)
        event = run.accept_token(
            token,
            self.vocab.piece(token),
            self.vocab.is_eog(token),
            n_ctx_used,
            self.n_ctx_slot,
            slot.id,
            probs,
        )
        if event is not None:
            run.sink(event)
        return token

    def _verify(self, p: _Placed) -> bool:
        """Judge a draft: sample row by row while the target agrees with it, keep the KV of the
        accepted tokens only. True when a rollback snapshot must be restored and the accepted
        tokens re-decoded (`_redecode`, after every row of this batch is read).

            batch rows   p   d0  d1  d2         target samples  d0  d1  x  -> 2 accepted
            kept KV      p   d0  d1             pending x (next step's first token)
        """
        slot, run, draft = p.slot, p.slot.running, p.draft
        assert run is not None and self.spec is not None
        first = run.out_index
        n_accepted = 0  # drafts kept in the KV
        n_matched = 0  # drafts the target agreed with (llama-server's count, the last included)
        for i in range(len(draft) + 1):
            token = self._sample_row(slot, run, first + i, p.pos0 + 1 + i)
            n_matched += int(i < len(draft) and token == draft[i])
            if run.finished or i == len(draft) or token != draft[i]:
                break
            n_accepted += 1
        self.spec.on_verified(run, len(draft), n_matched)
        keep = p.pos0 + 1 + n_accepted
        must_redecode = False
        if keep < len(slot.tokens):
            if p.rollback is None:
                self.ctx.seq_rm(slot.seq_id, keep, -1)
            else:
                must_redecode = True
            slot.tokens.truncate(keep)
        if run.finished:
            self._release(slot)
        return must_redecode

    def _redecode(self, placed: list[_Placed]) -> None:
        """Memory that cannot be cut: back to the snapshot, then decode the accepted tokens."""
        batch = self.batch
        batch.clear()
        ok: list[_Placed] = []
        for p in placed:
            assert p.rollback is not None
            if rollback(self.ctx, p.slot.seq_id, p.rollback, p.pos0):
                batch.add_span(p.slot.tokens.view()[p.pos0 :], p.pos0, p.slot.seq_id, False)
                ok.append(p)
            else:
                self._lose_slot(p.slot, "the slot could not be rolled back after a draft")
        if ok and self.ctx.decode(batch) != 0:
            for p in ok:
                self._lose_slot(p.slot, "the slot could not be re-decoded after a draft")

    def _lose_slot(self, slot: Slot, message: str) -> None:
        """Clear a slot whose KV no longer matches its tokens; its request (if any) fails."""
        log.error("slot %d: %s", slot.id, message)
        self.verbs.clear(slot)
        if slot.running is not None:
            self._release(slot, EngineError(slot.running.req_id, ErrorKind.SERVER, message))

    def _release(self, slot: Slot, error: EngineError | None = None) -> None:
        """End the slot's request: send its completion (or `error`) and free the slot."""
        run = slot.running
        assert run is not None
        slot.running = None
        slot.t_last_used = time.monotonic()
        completion: Completion | EngineError
        if error is not None:
            completion = error
        else:
            completion = run.completion(slot.id, len(slot.tokens))
            self.metrics.on_prediction(
                completion.timings.predicted_n, completion.timings.predicted_ms / 1e3
            )
        run.close()
        # A client that reads /slots or /metrics right after its answer sees the slot free
        # (llama-server answers those through its task queue, after the release).
        self.snapshot = self._make_snapshot()
        run.sink(completion)

    def _on_decode_failure(self, rc: int, placed: list[_Placed]) -> None:
        """Undo the step on every slot in the batch, then fail the request(s) it must cost."""
        for p in placed:
            run = p.slot.running
            assert run is not None
            if p.rollback is not None and rollback(self.ctx, p.slot.seq_id, p.rollback, p.pos0):
                # Memory that cannot be cut: the snapshot taken before the draft puts it back.
                p.slot.tokens.truncate(p.pos0)
                kept = p.pos0
            else:
                kept = self._truncate(p.slot, p.pos0)
            if p.span.is_decode:
                run.pending = p.token
            else:
                run.n_done -= p.span.n_tokens
            if kept < p.pos0:
                # The memory could not be cut back (recurrent state): the request cannot go on.
                self._release(
                    p.slot,
                    EngineError(
                        run.req_id,
                        ErrorKind.SERVER,
                        "decode failed and the slot could not be restored",
                    ),
                )
        running = [p.slot for p in placed if p.slot.running is not None]
        if not running:
            return
        if rc == 1:
            # No room in the KV pool: an idle resident moves to a page (the step is retried),
            # else the most recently admitted request gives way. Nothing is destroyed.
            if self._page_out_idle_resident():
                return
            victim = max(running, key=lambda s: s.running.admitted if s.running else -1)
            log.warning(
                "KV pool full: refusing request %s on slot %d",
                victim.running.req_id if victim.running else -1,
                victim.id,
            )
            self._release(
                victim,
                EngineError(
                    victim.running.req_id if victim.running else -1,
                    ErrorKind.UNAVAILABLE,
                    "the KV pool is full: no room for this request now (other slots hold their "
                    "conversations); retry later or erase a slot",
                ),
            )
            return
        log.error("llama_decode failed with %d", rc)
        for slot in running:
            assert slot.running is not None
            self._release(
                slot,
                EngineError(slot.running.req_id, ErrorKind.SERVER, f"llama_decode failed ({rc})"),
            )

    def _page_out_idle_resident(self) -> bool:
        """Page out the least recently used idle slot that holds tokens; True when one moved."""
        if self.store is None:
            return False
        idle = [s for s in self.slots if s.running is None and len(s.tokens) > 0]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.t_last_used)
        if slot.mind is not None:
            try:
                self.mind_slots.evict(slot)  # the mind keeps its own page name
            except (KvswapError, NoRoomYet):
                log.warning("KV pool full and idle mind slot %d could not be paged out", slot.id)
                return False
            return True
        name = f"auto-slot{slot.id}-{time.time_ns() // 1_000_000}"
        try:
            # An emergency: map the buffer here rather than wait a step for the worker.
            pending = self.verbs.begin_capture(PageOut(-1, slot.id, name, _no_reply), slot)
            moved = self.verbs.finish_capture(pending, new_buffer(pending.layout.n_bytes))
            assert isinstance(moved, PageMoved)
        except KvswapError as err:
            log.warning(
                "KV pool full and idle slot %d could not be paged out: %s", slot.id, err.message
            )
            return False
        log.warning(
            "KV pool full: paged out idle slot %d (%d tokens) as page %r",
            slot.id,
            moved.n_tokens,
            name,
        )
        return True

    # -- cancellation and shutdown ----------------------------------------------------------

    def _fail_orphan(self, run: RunningRequest, message: str) -> None:
        """End a request that lost its slot (its state could not come back)."""
        run.close()
        run.sink(EngineError(run.req_id, ErrorKind.SERVER, message))

    def _cancel(self, req_id: int) -> None:

        job = self.waiting.remove(req_id)
        if job is not None:
            if isinstance(job.payload, SlotCapture | SlotApply | SlotErase | PageOut | PageIn):
                # A verb's caller may hold buffers until the engine has answered.
                job.payload.reply(
                    KvswapError(ErrorKind.INVALID_REQUEST, "cancelled: the client went away")
                )
            return
        for slot in self.slots:
            if slot.running is not None and slot.running.req_id == req_id:
                slot.running.cancelled = True
                self._release(slot)
                return

    def _fail_everything(self, kind: ErrorKind, message: str) -> None:
        for pending in self._pending.values():
            self.verbs.abandon(pending)
            pending.slot.locked = False
            pending.cmd.reply(KvswapError(kind, message))
        self._pending.clear()
        for slot in self.slots:
            if slot.running is not None:
                self._release(slot, EngineError(slot.running.req_id, kind, message))
        for job in list(self.waiting.jobs):
            cmd = job.payload
            if isinstance(cmd, Submit):
                cmd.sink(EngineError(job.req_id, kind, message))
            elif isinstance(cmd, SlotCapture | SlotApply | SlotErase | PageOut | PageIn):
                cmd.reply(KvswapError(kind, message))
        self.waiting.jobs.clear()

    def _own_metrics(self) -> dict[str, float]:
        counters = self.verbs.counters
        budget = self.memory.budget.counters
        out: dict[str, float] = {
            "page_out_total": counters.page_out_total,
            "page_in_total": counters.page_in_total,
            "page_failed_total": counters.page_failed_total,
            "ctx_checkpoint_bytes": self.memory.total_bytes,
            "ctx_checkpoints_evicted_budget_total": budget.evicted_budget_total,
            "ctx_checkpoints_skipped_budget_total": budget.skipped_budget_total,
            "reconfigure_total": self.reconfigurer.total,
            "reconfigure_failed_total": self.reconfigurer.failed_total,
        }
        if self.store is not None:
            out["page_store_bytes"] = self.store.charged_bytes
            out["page_store_pages"] = self.store.n_pages
            out["page_spill_held_bytes"] = self.store.held_bytes
        out.update(self.minds.counters.as_metrics())
        out.update(self.anon.metrics())
        return out

    # -- snapshots --------------------------------------------------------------------------

    def _make_snapshot(self) -> EngineSnapshot:
        slots = []
        for slot in self.slots:
            run = slot.running or self._last_run.get(slot.id)
            slots.append(
                SlotSnapshot(
                    id=slot.id,
                    n_ctx=self.n_ctx_slot,
                    is_processing=slot.running is not None,
                    n_cached=len(slot.tokens),
                    id_task=run.req_id if run else -1,
                    request=run.request if run else None,
                    n_prompt_tokens=len(run.prompt) if run else 0,
                    n_prompt_tokens_processed=(run.n_done - run.n_cache) if run else 0,
                    n_prompt_tokens_cache=run.n_cache if run else 0,
                    n_decoded=len(run.generated) if run else 0,
                    has_next_token=slot.running is not None,
                    generated_text=run.text.content if run else "",
                    speculative=self.spec is not None,
                )
            )
        n_busy = sum(1 for s in self.slots if s.running is not None)
        return EngineSnapshot(
            slots=tuple(slots),
            geometry=self.geometry,
            n_ctx=self.ctx.n_ctx,
            n_ctx_slot=self.n_ctx_slot,
            metrics=self.metrics.snapshot(
                n_busy, len(self.waiting), spec=self.spec, **self._own_metrics()
            ),
            n_waiting=len(self.waiting),
            crashed=self.crashed,
            minds=tuple((s.mind, s.id, len(s.tokens)) for s in self.slots if s.mind is not None),
        )
