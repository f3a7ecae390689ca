"""Background responses while they run in this process (`background: true`): each one's task,
the response object as it stands and its stream's events, so a GET answers it live, a stream
replayed with `starting_after` follows it to its end, and a cancel stops it.

`Backgrounds.start` runs the caller's work as a task (it needs no HTTP connection and outlives
the request that made it); the work reports through its `Run` (`emit` an event, `set_body`).
A finished run is dropped from here (its record is the store's); `n_live` counts a tenant's
runs, which the route holds to `--state-background-per-key`. Runs on the event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Run:
    """One background response: its body and events so far."""

    body: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._wake()

    def set_body(self, body: dict[str, Any]) -> None:
        self.body = body
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class Backgrounds:
    """See the module docstring."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], Run] = {}

    def start(
        self, ns: str, rid: str, body: dict[str, Any], work: Callable[[Run], Awaitable[None]]
    ) -> Run:
        run = Run(body)
        key = (ns, rid)
        self._runs[key] = run

        async def main() -> None:
            try:
                await work(run)
            finally:
                self._runs.pop(key, None)
                run.finish()

        run.task = asyncio.ensure_future(main())
        return run

    def n_live(self, ns: str) -> int:
        """The runs of tenant `ns` queued or running here now."""
        return sum(1 for run_ns, _ in self._runs if run_ns == ns)

    def body(self, ns: str, rid: str) -> dict[str, Any] | None:
        run = self._runs.get((ns, rid))
        return run.body if run is not None else None

    def follow(self, ns: str, rid: str, after: int) -> AsyncIterator[dict[str, Any]] | None:
        """The run's events numbered past `after`, then each new one until it ends; None when
        no such run is live here."""
        run = self._runs.get((ns, rid))
        return _follow(run, after) if run is not None else None

    def cancel(self, ns: str, rid: str) -> bool:
        run = self._runs.get((ns, rid))
        if run is None or run.task is None:
            return False
        run.task.cancel()
        return True

    async def cancel_and_wait(self, ns: str, rid: str) -> dict[str, Any] | None:
        """Cancel a live run and wait for its end; its last body (None: no live run)."""
        run = self._runs.get((ns, rid))
        if run is None or run.task is None:
            return None
        run.task.cancel()
        await asyncio.wait({run.task})
        return run.body

    async def close(self) -> None:
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def _follow(run: Run, after: int) -> AsyncIterator[dict[str, Any]]:
    sent = 0
    while True:
        for event in run.events[sent:]:
            if int(event.get("sequence_number", -1)) > after:
                yield event
        sent = len(run.events)
        if run.done:
            return
        await run.changed.wait()
