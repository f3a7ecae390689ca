"""`background: true`: a stored Responses turn run as a task that outlives its request.

The POST answers at once (the response `queued`, or with `stream: true` its events as they
come, which a client may leave and pick up again with GET `?stream=true&starting_after=N`).
The task holds the turn's mind as a request would (without an HTTP connection to watch), runs
it, and records the response with its stream's events before its last events go out; a
cancel (POST /cancel, DELETE) ends it `cancelled`, an error `failed`, both kept for GET. One
API key has at most `--state-background-per-key` runs queued or running (`check_limit`: a 429).
While it runs, the store holds it as pending (another process or a restart sees it `queued`).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, EngineError
from kvswap.minds.chains import ChainStart, StoredChains
from kvswap.minds.runs import Run
from kvswap.minds.session import Seed
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.response_stream import ResponseStream
from kvswap.server.openai.schemas_responses import ResponsesRequest
from kvswap.server.openai.stateful import TurnWriter, prepare_stored
from kvswap.server.state import ServerState
from kvswap.server.streaming import Turn

log = logging.getLogger("kvswap.server")


def check_limit(state: ServerState, ns: str) -> None:
    """A 429 when tenant `ns` has as many runs queued or running as
    `--state-background-per-key` (a run costs its client no connection, and outlives it)."""
    limit = state.config.state.background_per_key
    if state.backgrounds.n_live(ns) >= limit:
        raise KvswapError(
            ErrorKind.RATE_LIMIT,
            f"this API key has {limit} background responses queued or running, the most it "
            "may (--state-background-per-key); wait for one to end, or cancel one",
            retry_after_s=1,
        )


class BackgroundTurn:
    """One background turn's inputs (see the module docstring)."""

    def __init__(
        self,
        state: ServerState,
        chains: StoredChains,
        ns: str,
        req: ResponsesRequest,
        data: dict[str, Any],
        start: ChainStart,
        mind: PageKey | None,
        meta: fr.ResponseMeta,
    ) -> None:
        self.state, self.chains, self.ns = state, chains, ns
        self.req, self.data, self.start, self.mind, self.meta = req, data, start, mind, meta

    async def begin(self, seed: Seed | None, params: Any) -> Run:
        """Record it as queued and start its task."""
        queued = fr.response_json(self.meta, status="queued", output=[])
        await self.chains.run(self.chains.records.put_pending, self.ns, self.meta.id, queued, [])
        return self.state.backgrounds.start(
            self.ns, self.meta.id, queued, lambda run: self._work(run, seed, params)
        )

    async def _work(self, run: Run, seed: Seed | None, params: Any) -> None:
        try:
            await self._run(run, seed, params)
            seed = None
        except asyncio.CancelledError:
            await self._ended(run, "cancelled", None)
        except KvswapError as err:
            await self._ended(run, "failed", {"code": err.kind.value, "message": err.message})
        except Exception as err:  # the task has no caller to raise to: its response says it
            log.exception("background response %s failed", self.meta.id)
            await self._ended(run, "failed", {"code": "server_error", "message": repr(err)})
        finally:
            if seed is not None:
                seed.close()

    async def _run(self, run: Run, seed: Seed | None, params: Any) -> None:
        state = self.state
        async with AsyncExitStack() as exits:
            held = None
            if self.mind is not None:
                held = await exits.enter_async_context(state.minds.turn(self.mind, None))
                held.seed = seed
            runner = Turn(state.client, state.minds, held, exits)
            sj = await asyncio.to_thread(
                prepare_stored, state, self.data, self.req, self.start, self.mind
            )
            self.meta.params.update(params(sj))
            stream = ResponseStream(state, sj.job.plan, fr.ResponseEvents(self.meta))
            run.set_body(fr.response_json(self.meta, status="in_progress", output=[]))
            writer = TurnWriter(self.chains, self.ns, sj, self.meta)
            # Streamed whatever the body says: the run's events are its record and its replay.
            request = replace(sj.job.requests[0], stream=True)
            async for event in runner.stream(request):
                if isinstance(event, EngineError):
                    raise KvswapError(event.kind, event.message)
                if not isinstance(event, Completion):
                    for out in stream.render(0, event):
                        run.emit(out)
                    continue
                final = stream.finish(event)
                body = final[-1]["response"]
                await writer.write(body, event, run.events + final)
                for out in final:
                    run.emit(out)
                run.set_body(body)

    async def _ended(self, run: Run, status: str, error: dict[str, str] | None) -> None:
        body = {**run.body, "status": status, "error": error}
        run.set_body(body)
        await self.chains.run(
            self.chains.records.put_pending, self.ns, self.meta.id, body, run.events
        )
