"""`--sleep-idle-seconds`: free the contexts and the model after N idle seconds, wake on the next
request.

The Sleeper counts HTTP requests in flight (the guard calls `enter`/`leave` around each one) and
notes when the last one ended. Once nothing has run for N seconds and the server holds nothing a
sleep would lose, it sleeps: every mind is spilled to the save path (`Loader.sleep`, which runs
the same shutdown as an exit), then the engine, its contexts and the model are freed. The next
authenticated request (anything but /health, which answers as llama-server's does while asleep
and does not count as activity) waits while the model and contexts load again with the geometry,
KV types and LoRA global scales in force when the server fell asleep (`Loader.wake`), and the
minds spilled in the save path are served as after a restart. /props, /models, /v1/models,
/metrics and /slots neither wake it nor count as activity: asleep, they get the answers kept
just before sleeping (/props saying it sleeps). A server never sleeps while it holds what a
sleep would lose: named RAM pages that are not minds, or minds without a save path to spill
them to.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kvswap.core.keys import PageKind

if TYPE_CHECKING:
    from kvswap.server.loader import Loader

log = logging.getLogger("kvswap.server")

_POLL_S = 0.25
# (status, headers, body) of a route's answer.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
# The throughput gauges, rates over the window since the previous read of /metrics.
_RATE_GAUGES = re.compile(
    rb"^(llamacpp:(?:prompt_tokens_seconds|predicted_tokens_seconds)) \S+$", re.M
)


class WakeFailed(Exception):
    """The model and contexts could not be loaded again after sleeping."""


class Sleeper:
    """Idle tracking and the sleep/wake transitions (see the module docstring)."""

    def __init__(self, loader: Loader, idle_s: float) -> None:
        self.loader = loader
        self.idle_s = idle_s
        self.sleeping = False
        self.n_sleeps = 0
        self._in_flight = 0
        self._t_last = time.monotonic()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._why_awake = ""  # the last reason logged for staying awake
        # A GET through the app (set by the guard), and what it answered just before sleeping.
        self.fetch: Callable[[str], Awaitable[Answer]] | None = None
        self._asleep: dict[str, Answer] = {}
        self._n_metrics_reads = 0

    def start(self) -> None:
        if self.idle_s >= 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def enter(self) -> None:
        """A request arrives: it counts as activity, and wakes a sleeping server first (the
        caller calls `leave` whatever happens; WakeFailed when the model cannot load again)."""
        self._in_flight += 1
        if self.sleeping or self._lock.locked():  # asleep, falling asleep, or waking
            async with self._lock:
                if self.sleeping:
                    t0 = time.perf_counter()
                    try:
                        await asyncio.to_thread(self.loader.wake, asyncio.get_running_loop())
                    except RuntimeError as err:
                        raise WakeFailed(str(err)) from err
                    self.sleeping = False
                    log.info("awake in %.0f ms", (time.perf_counter() - t0) * 1e3)

    def leave(self) -> None:
        self._in_flight -= 1
        self._t_last = time.monotonic()

    def _reason_to_stay_awake(self) -> str:
        state = self.loader.state
        if state is None:
            return "loading"
        snap = state.snapshot
        if snap.n_waiting or any(s.is_processing for s in snap.slots):
            return "work in progress"
        store = state.store
        kinds = [p.key.kind for p in store.infos()] if store is not None else []
        named = kinds.count(PageKind.PAGE)
        if named:
            return f"{named} named page(s) would be lost (page_drop or spill them)"
        has_minds = bool(snap.minds) or PageKind.MIND in kinds
        if has_minds and state.save_dir is None:
            return "minds are held and there is no --slot-save-path to spill them to"
        return ""

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_POLL_S)
            if self.sleeping or self._in_flight:
                continue
            if time.monotonic() - self._t_last < self.idle_s:
                continue
            why = self._reason_to_stay_awake()
            if why:
                if why != self._why_awake:
                    log.info("idle for %.0f s but staying awake: %s", self.idle_s, why)
                    self._why_awake = why
                continue
            async with self._lock:
                if self._in_flight:
                    continue
                self._why_awake = ""
                t0 = time.perf_counter()
                await self._keep_answers()
                await asyncio.to_thread(self.loader.sleep)
                self.sleeping = True
                self.n_sleeps += 1
                log.info(
                    "sleeping after %.0f idle seconds (minds spilled, model freed in %.0f ms)",
                    self.idle_s,
                    (time.perf_counter() - t0) * 1e3,
                )

    async def _keep_answers(self) -> None:
        """What the read-only routes answer while asleep: their answers now, /props saying
        it sleeps (llama-server keeps the same, `update_cached_responses`)."""
        self._asleep = {}
        self._n_metrics_reads = 0
        if self.fetch is None:
            return
        for path in ("/props", "/models", "/v1/models", "/metrics", "/slots"):
            status, headers, body = await self.fetch(path)
            if path == "/props" and status == 200:
                props = json.loads(body)
                props["is_sleeping"] = True
                body = json.dumps(props).encode()
                headers = [
                    (k, str(len(body)).encode() if k == b"content-length" else v)
                    for k, v in headers
                ]
            self._asleep[path] = (status, headers, body)

    def asleep_answer(self, path: str) -> Answer | None:
        """A read-only route's answer while asleep; None: none kept (the request wakes it).

        /metrics gives the reading taken before sleeping once; later reads show the
        throughput gauges at 0 (nothing ran since), as llama-server's buckets.
        """
        answer = self._asleep.get(path)
        if answer is None or path != "/metrics":
            return answer
        self._n_metrics_reads += 1
        if self._n_metrics_reads == 1:
            return answer
        status, headers, body = answer
        body = _RATE_GAUGES.sub(rb"\1 0", body)
        headers = [
            (k, str(len(body)).encode() if k == b"content-length" else v) for k, v in headers
        ]
        return status, headers, body
