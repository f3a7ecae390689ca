"""The engine thread: the only caller of libllama for contexts, slots and samplers.

One loop, one step at a time:

    drain commands -> start waiting work on idle slots -> plan (pure) -> make room -> step ->
    apply the step's outcome -> reconfigure tick -> start waiting work -> publish a snapshot

HTTP handlers reach it only through `EngineClient`, which posts commands to `inbox`. The engine
owns the managers and hands each the narrow owners it uses (the runtime, the slot table, the page
store, the mind registry and its neighbours); none of them imports or calls back into the
engine. No file I/O: workers read and write slot files around `SlotCapture` and `SlotApply`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model
from kvswap.backend.sampler import SamplerChain
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import Completion, EngineError, MindSeated
from kvswap.engine.admission import check_request
from kvswap.engine.captures import Captures
from kvswap.engine.commands import (
    SLOT_VERBS,
    Cancel,
    Command,
    FlushMinds,
    ForgetMind,
    MindTokens,
    MindVerb,
    Nudge,
    Reconfigure,
    RoomReport,
    ShedCache,
    Shutdown,
    Submit,
    refuse,
)
from kvswap.engine.kv.buffers import BufferReady, BufferWorker
from kvswap.engine.kv.checkpoints import CheckpointBudget
from kvswap.engine.kv.pagestore import SHELF_MAX, PageStore
from kvswap.engine.kv.verbs import PageCounters
from kvswap.engine.metrics import EngineMetrics
from kvswap.engine.plan.scheduler import Job, WaitQueue
from kvswap.engine.reconfigure import Finished, Reconfigurer
from kvswap.engine.room import Room
from kvswap.engine.running import RunningRequest
from kvswap.engine.runtime import EngineConfig, Runtime
from kvswap.engine.seats.anoncache import AnonCache
from kvswap.engine.seats.flushes import FlushSchedule
from kvswap.engine.seats.handoffs import Handoffs
from kvswap.engine.seats.outcomes import NoRoomYet, PagedOut, Seat
from kvswap.engine.seats.registry import MindRegistry
from kvswap.engine.seats.seating import Seating
from kvswap.engine.slot import Slot, SlotTable
from kvswap.engine.snapshot import EngineSnapshot, own_metrics, take_snapshot
from kvswap.engine.spec.speculate import Speculator
from kvswap.engine.step import StepOutcome, Stepper

log = logging.getLogger("kvswap.engine")

_NO_TOKENS = np.zeros(0, dtype=np.int32)  # the prompt of a job that only seats a mind


class Engine:
    """Runs requests on a model's context in a thread of its own."""

    def __init__(
        self,
        model: Model,
        config: EngineConfig,
        adapters: Adapters | None = None,
        draft_model: Model | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.vocab = model.vocab
        # LoRA adapters (owned by the loader): a step batches only slots of one set (`step`).
        self.adapters = adapters if adapters is not None else Adapters()
        self.spec = Speculator(config.spec, draft_model) if config.spec is not None else None
        self.waiting = WaitQueue(config.slot_prompt_similarity)
        self.metrics = EngineMetrics()
        self._n_admitted = 0
        self._last_run: dict[int, RunningRequest] = {}  # slot id -> its last request (for /slots)
        self.inbox: queue.SimpleQueue[Command | BufferReady] = queue.SimpleQueue()
        self.buffers = BufferWorker(self.inbox.put)
        self.store = self._new_store(config)
        # A mind's bookkeeping, each shared with the HTTP side and the demoter (`PagesHandle`).
        self.registry = MindRegistry(config.clock)
        self.flushes, self.handoffs = FlushSchedule(), Handoffs()
        self.runtime = rt = self._new_runtime()
        self.slots = SlotTable(rt.geometry.n_parallel, rt.n_ctx_slot)
        # A client's slot verbs, and captures waiting for their buffer (the flush before exit).
        self.captures = Captures(
            rt,
            self.buffers,
            self.store,
            self.adapters,
            left=lambda slot: self.seating.left(slot),
            shed=lambda n_bytes: self.anon.shed(n_bytes, now=True),
        )
        self._stalled = False  # a full KV pool waits for a buffer: the next drain blocks
        self.anon = AnonCache(
            store=self.store,
            runtime=rt,
            slots=self.slots,
            budget_bytes=config.cache_ram_bytes,
            buffers=self.buffers,
            cache_idle_slots=config.cache_idle_slots,
            seed_from_minds=config.seed_from_minds,
        )
        self.seating = self._new_seating()
        self.reconfigurer = self._new_reconfigurer()
        self.stepper = Stepper(
            runtime=rt, slots=self.slots, vocab=self.vocab, metrics=self.metrics, spec=self.spec
        )
        # A unified pool's cells, planned before a start or a step needs them.
        self.room = Room(rt, self.slots, self.seating.page_out_idle_resident, self.stepper.replan)
        self.crashed: str | None = None  # set when the loop died: every command then fails
        self._thread: threading.Thread | None = None
        # The view read by /slots, /props, /metrics and /health (see `snapshot`).
        self._snapshot = self._make_snapshot()
        self._changed = False  # something besides a running request's progress changed
        self._read = False  # `snapshot` was read since the last publish

    def _new_store(self, config: EngineConfig) -> PageStore | None:
        if config.page_ram_bytes <= 0:
            return None
        return PageStore(config.page_ram_bytes, self.buffers.dispose, shelf_max=SHELF_MAX)

    def _new_runtime(self) -> Runtime:
        """The context and everything its geometry builds, warmed up when asked."""
        config = self.config
        rt = Runtime(
            model=self.model,
            config=config,
            adapters=self.adapters,
            spec=self.spec,
            store=self.store,
            budget=CheckpointBudget(config.ctx_checkpoints, config.ctx_checkpoints_bytes),
            counters=PageCounters(),
        )
        if config.warmup:
            rt.warm_up()
        return rt

    def _new_seating(self) -> Seating:
        return Seating(
            store=self.store,
            slots=self.slots,
            runtime=self.runtime,
            buffers=self.buffers,
            registry=self.registry,
            flushes=self.flushes,
            handoffs=self.handoffs,
            anon=self.anon,
            idle_out=self.config.cache_idle_slots,
        )

    def _new_reconfigurer(self) -> Reconfigurer:
        return Reconfigurer(
            runtime=self.runtime,
            slots=self.slots,
            store=self.store,
            model_info=self.model.info,
            registry=self.registry,
            anon=self.anon,
            buffers=self.buffers,
            fault_on_install=self.config.fault_on_install,
        )

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
        self.seating.close()
        self.anon.close()
        if self.store is not None:
            self.store.close()
        self.buffers.close()
        self.runtime.close()

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._drain(block=not self._busy() or self._stalled):
                self._stalled = False
                self._start_waiting()
                plan, lora = self.stepper.plan()
                fitted = self.room.fit(plan) if plan.spans else plan
                if fitted is None:
                    self._stalled = True  # nothing fits until a move's buffer arrives
                elif fitted.spans:
                    self._apply(self.stepper.run(fitted, lora, self.captures.frozen()))
                finished = self.reconfigurer.tick(captures_pending=bool(self.captures))
                if finished is not None:
                    self._reconfigured(finished)
                # The step or the tick may have freed a slot that queued work waits for: start
                # it now, or the next drain would sleep on the inbox with that work stranded.
                self._start_waiting()
                if self._changed or self._read or not self._busy():
                    self._publish()
        except Exception as err:
            log.exception("engine loop crashed")
            self.crashed = f"the engine stopped after an internal error ({type(err).__name__})"
            self._fail_everything(ErrorKind.SERVER, self.crashed)
            self._publish()
            self._refuse_forever(self.crashed)
            return
        self._fail_everything(ErrorKind.UNAVAILABLE, "the server is shutting down")

    def _refuse_forever(self, message: str) -> None:
        """After a crash: answer every command with a typed 500 until shutdown (no hang)."""
        while not isinstance(cmd := self.inbox.get(), Shutdown):
            if isinstance(cmd, BufferReady):  # a buffer nobody will use now
                if cmd.buffer is not None:
                    cmd.buffer.close()
            else:
                refuse(cmd, KvswapError(ErrorKind.SERVER, message))

    def _busy(self) -> bool:
        return bool(self.slots.busy()) or not self.reconfigurer.admission_open

    @property
    def snapshot(self) -> EngineSnapshot:
        """The engine's state as of a step boundary (any thread).

        Republished after every loop pass that changed more than a running request's progress
        (a command, an admission, a release, a reconfigure), after a pass that found it read,
        and whenever the engine goes idle: a decode that nobody watches builds no views, and a
        reader polling it sees progress at most one step old."""
        self._read = True
        return self._snapshot

    def _publish(self) -> None:
        # Flags first: a read while the view is built asks for the next one.
        self._changed = self._read = False
        self._snapshot = self._make_snapshot()

    def _drain(self, block: bool) -> bool:
        """Handle queued commands; False once asked to shut down."""
        if block and self.config.check_integrity:
            self.check_integrity()
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
        self._changed = True
        if isinstance(cmd, Submit):
            err = self._check_submit(cmd)
            if err is not None:
                cmd.sink(err)
                return
            prompt = np.asarray(cmd.request.prompt_tokens, dtype=np.int32)
            self.waiting.add(Job.of(cmd.req_id, cmd.request, prompt, cmd))
        elif isinstance(cmd, Cancel):
            self._cancel(cmd.req_id)
        elif isinstance(cmd, BufferReady):
            cmd.then(cmd)  # a buffer the worker mapped, for whoever asked
        elif isinstance(cmd, Reconfigure):
            self.reconfigurer.submit(cmd)
        elif isinstance(cmd, Nudge):
            if cmd.reply is not None:
                cmd.reply(None)
        elif isinstance(cmd, RoomReport):
            self.seating.on_room_report(cmd)
        elif isinstance(cmd, ShedCache):
            cmd.reply(self.anon.shed(cmd.n_bytes))
        elif isinstance(cmd, FlushMinds):
            self.captures.flush(cmd, self.slots.idle_minds(cmd.keys), self.seating.spare)
        elif isinstance(cmd, ForgetMind):
            cmd.reply(self.seating.forget(cmd.key))
        elif isinstance(cmd, MindTokens):
            cmd.reply(self.seating.tokens_of(cmd.key))
        elif isinstance(cmd, SLOT_VERBS):
            if not self.slots.valid(cmd.slot_id):
                cmd.reply(KvswapError(ErrorKind.INVALID_REQUEST, "Invalid slot ID"))
                return
            self.waiting.add(Job(cmd.req_id, cmd.slot_id, None, cmd))
        elif isinstance(cmd, MindVerb):  # it waits for the mind's slot, as a request naming it
            self.waiting.add(Job(cmd.req_id, -1, _NO_TOKENS, cmd, mind=cmd.key))

    def _check_submit(self, cmd: Submit) -> EngineError | None:
        rt = self.runtime
        return check_request(
            cmd.req_id, cmd.request, n_slots=len(self.slots), n_ctx_slot=rt.n_ctx_slot,
            n_adapters=len(self.adapters), valid_token=self.vocab.valid, shape=rt.geometry,
            trained=rt.trained,
        )  # fmt: skip

    # -- admission --------------------------------------------------------------------------

    def _start_waiting(self) -> None:
        if not self.reconfigurer.admission_open:
            return  # a reconfigure waits for seats: arriving work queues
        for job, slot in self.waiting.startable(self.slots):
            self._changed = True
            cmd = job.payload
            if isinstance(cmd, Submit) and not self.room.may_start(cmd.request):
                self.waiting.jobs.insert(0, job)  # started when a running request ends
                break
            try:
                seat = self.seating.seat(slot, cmd)
            except NoRoomYet:
                self.waiting.put_back(job)  # retried when the demoter has made room
                break
            except KvswapError as err:
                refuse(cmd, err)
                continue
            self.registry.count(seat_wait_ms_total=job.held_ms())
            if isinstance(cmd, Submit):
                assert job.prompt is not None
                self._admit(cmd, job.prompt, slot, seat)
            elif isinstance(cmd, SLOT_VERBS):
                reprefill = self.captures.run(cmd, slot)  # a token-only page_in re-prefills
                if reprefill is not None:
                    tokens = np.asarray(reprefill.request.prompt_tokens, dtype=np.int32)
                    self._admit(reprefill, tokens, slot)
            elif isinstance(cmd, MindVerb):  # (seated, paged out or erased by `seat`)
                cmd.reply(slot.id if slot.mind == cmd.key else -1)

    def _admit(self, cmd: Submit, prompt: np.ndarray, slot: Slot, seat: Seat | None = None) -> None:
        req = cmd.request
        rt = self.runtime
        served = self.seating.served(seat, slot, prompt) if seat is not None else None
        n_keep = slot.reusable(prompt, req)
        n_keep = min(n_keep, len(prompt) - 1)  # at least one token is evaluated
        n_keep = rt.memory.cut(slot, n_keep)
        slot.lora = req.lora
        slot.namespace = req.namespace
        sampler = SamplerChain(self.vocab, req.sampling, rt.n_ctx_slot)
        for tok in prompt[max(0, len(prompt) - req.sampling.history_needed(rt.n_ctx_slot)) :]:
            sampler.accept(int(tok))
        self._n_admitted += 1
        slot.running = RunningRequest(
            cmd.req_id, req, prompt, cmd.sink, sampler, n_keep, self._n_admitted, served
        )
        if served is not None:  # before any output: the answer's headers say it
            slot.running.sink(MindSeated(cmd.req_id, served))
        slot.running.checkpoint_at = rt.memory.plan(len(prompt), n_keep)
        slot.running.spec.enabled = self.spec is not None
        if req.return_progress and req.stream:  # llama-server's 0% event, before any decode
            slot.running.sink(slot.running.progress())
        self.anon.cache_idle_slots(slot)
        self._last_run[slot.id] = slot.running
        self.metrics.on_prompt_cached(n_keep)

    # -- one step ---------------------------------------------------------------------------

    def _apply(self, outcome: StepOutcome) -> None:
        """End the requests the step finished; a full KV pool pages an idle resident out (the
        step is then retried), else the most recently admitted request gives way. The snapshot
        is refreshed before any completion goes out: a client that has its answer reads /slots
        and /pages as they are after it."""
        ended = [self._end(self.slots[i], error) for i, error in outcome.finished.items()]
        paged = PagedOut.NOTHING
        if outcome.kv_full:
            paged = self.seating.page_out_idle_resident()
            if paged is PagedOut.WAITING:
                self._stalled = True  # nothing fits until the buffer (or room) arrives
        running = [s for s in outcome.retry if s.running is not None]
        if outcome.kv_full and running and paged is PagedOut.NOTHING:
            victim = max(running, key=lambda s: s.running.admitted if s.running else -1)
            req_id = victim.running.req_id if victim.running else -1
            log.warning("KV pool full: refusing request %s on slot %d", req_id, victim.id)
            message = (
                "the KV pool is full: no room for this request now (other slots hold their "
                "conversations); retry later or erase a slot"
            )
            ended.append(self._end(victim, EngineError(req_id, ErrorKind.UNAVAILABLE, message)))
        if ended:
            self._publish()
        for deliver in ended:
            deliver()

    def _release(self, slot: Slot, error: EngineError | None = None) -> None:
        """End the slot's request and send its completion (or `error`) now."""
        self._end(slot, error)()

    def _end(self, slot: Slot, error: EngineError | None) -> Callable[[], None]:
        """Free the slot of its request; returns the delivery of its completion (or `error`)."""
        run = slot.running
        assert run is not None
        slot.running = None
        slot.t_last_used = time.monotonic()
        self._changed = True
        completion: Completion | EngineError
        if error is not None:
            completion = error
        else:
            completion = run.completion(slot.id, len(slot.tokens))
            self.metrics.on_prediction(
                completion.timings.predicted_n, completion.timings.predicted_ms / 1e3
            )
        run.close()
        # A buffer for when a later request moves its state out of the slot.
        (self.anon if slot.mind is None else self.seating).expect(slot)
        return lambda: run.sink(completion)

    def _reconfigured(self, finished: Finished) -> None:
        """A reconfigure ended: queued work that no longer fits fails, typed; /props shows the
        new geometry before the reply."""
        if finished.changed:
            for job in list(self.waiting.jobs):
                cmd = job.payload
                if isinstance(cmd, Submit) and (err := self._check_submit(cmd)) is not None:
                    self.waiting.remove(job.req_id)
                    cmd.sink(err)
                elif isinstance(cmd, SLOT_VERBS) and not self.slots.valid(cmd.slot_id):
                    self.waiting.remove(job.req_id)
                    refuse(
                        cmd,
                        KvswapError(
                            ErrorKind.INVALID_REQUEST, "Invalid slot ID (the geometry changed)"
                        ),
                    )
            self._publish()
        finished.cmd.reply(finished.result)

    # -- cancellation and shutdown ----------------------------------------------------------

    def _cancel(self, req_id: int) -> None:
        job = self.waiting.remove(req_id)
        if job is not None:
            if isinstance(job.payload, (*SLOT_VERBS, MindVerb)):
                # A verb's caller may hold buffers until the engine has answered.
                refuse(
                    job.payload,
                    KvswapError(ErrorKind.INVALID_REQUEST, "cancelled: the client went away"),
                )
            return
        for slot in self.slots.busy():
            if slot.running is not None and slot.running.req_id == req_id:
                slot.running.cancelled = True
                self._release(slot)
                return

    def _fail_everything(self, kind: ErrorKind, message: str) -> None:
        self.captures.fail_all(kind, message)
        for slot in self.slots.busy():
            if slot.running is not None:
                self._release(slot, EngineError(slot.running.req_id, kind, message))
        for job in self.waiting.jobs:
            refuse(job.payload, KvswapError(kind, message))
        self.waiting.jobs.clear()

    def check_integrity(self) -> None:
        """Every byte owner's invariants (debug: run whenever the loop goes idle)."""
        self.runtime.check_integrity(self.slots)
        self.seating.check_integrity()
        self.anon.check_integrity()
        if self.store is not None:
            self.store.check_integrity()

    # -- snapshots (see `snapshot`) -----------------------------------------------------------

    def _make_snapshot(self) -> EngineSnapshot:
        return take_snapshot(
            slots=self.slots,
            last_run=self._last_run,
            runtime=self.runtime,
            metrics=self.metrics,
            n_waiting=len(self.waiting),
            crashed=self.crashed,
            extra=own_metrics(
                self.runtime, self.store, self.registry, self.anon, self.reconfigurer
            ),
        )
