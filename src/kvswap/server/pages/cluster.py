"""A mind's turn in a cluster, on the HTTP side: whose mind it is, and what its end writes.

`ClusterGate.place(key)` runs in the mind's session (under its per-mind lock), before the turn
is submitted:
- the mind's lease is ours (renewed) or free (taken): the turn runs here; a mind just taken is
  resumed first (`tiers.shared.resume`: the tier's page fetched, checked and handed to the
  engine with the turn, or a fallback);
- another replica holds it and may be alive: `ForwardTurn` (the forwarder sends the turn there,
  `pages.forward`);
- the holder cannot be what serves the turn (the forward to it failed, the turn was forwarded
  here already, or it is a past life of this replica): its lease is waited out, polled until it
  expires or is released, at most about one lease period; then a typed 503 with Retry-After.
  A forwarded turn whose holder is alive and renewing is answered 503 at once (never forwarded
  twice);
- Redis away and the mind not held here: 503 with Retry-After (held minds keep serving).

`turn_done` runs when the turn's engine request has completed, before its answer goes out: the
token log is written through and the page published past the RPO bound (`writer.end_turn`); a
mind lost meanwhile fails the turn (503) and its copies here are dropped. A takeover's costs
(lease wait, fetch, verify, restore, prefill, tokens prefilled again) are counted then.

Owns the worker threads that call the shared tier (Redis) and the pending hand-offs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from kvswap.core.errors import ErrorKind, MindUnavailable
from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, EngineError, GenerationRequest
from kvswap.engine.minds.registry import MindRegistry
from kvswap.server.pages import turn as turns
from kvswap.server.pages.turn import ForwardTurn, Owner
from kvswap.tiers.shared.errors import TierUnavailable
from kvswap.tiers.shared.holdings import Held
from kvswap.tiers.shared.lease import LeaseHolder
from kvswap.tiers.shared.replica import SharedTier, TierView
from kvswap.tiers.shared.resume import Resumed

log = logging.getLogger("kvswap.cluster")

T = TypeVar("T")
_POLL_S = 0.05  # how often a lease being waited out is looked at
_WATCH_S = 0.25  # how often the lease of an owner a turn was forwarded to is looked at
_N_THREADS = 8  # Redis round trips of concurrent turns (leases, fetches, appends)


class ClusterGate:
    """See the module docstring."""

    def __init__(self, tier: SharedTier, registry: MindRegistry) -> None:
        self.tier = tier
        self.registry = registry
        self.lease_s = tier.settings.lease_ms / 1000
        self.wait_bound_s = self.lease_s * 1.2 + 0.5
        self._pool = ThreadPoolExecutor(_N_THREADS, thread_name_prefix="kvswap-shared")
        self._handoffs: dict[PageKey, asyncio.Future[None]] = {}
        self._takeovers: dict[PageKey, tuple[Resumed, float]] = {}  # key -> (resume, lease wait s)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- before a turn -----------------------------------------------------------------------

    async def place(self, key: PageKey) -> Resumed:
        """Make the mind ours for this turn (see the module docstring)."""
        self._takeovers.pop(key, None)
        handoff = self._handoffs.get(key)
        if handoff is not None:
            await asyncio.wait({handoff}, timeout=self.lease_s)
        turn = turns.current()
        t0 = time.monotonic()
        waited = False
        last: LeaseHolder | None = None
        while True:
            got = await self._take(key)
            if isinstance(got, Held):
                break
            self._refuse_or_forward(key, got, last, turn)
            if time.monotonic() - t0 > self.wait_bound_s:
                self.tier.stats.count(n_unavailable=1)
                raise MindUnavailable(
                    f"the mind's owner {got.replica_id} ({got.advertise_url}) cannot be reached "
                    f"and still holds its lease after {self.wait_bound_s:.1f} s",
                    retry_after_s=max(1.0, got.ttl_left_ms / 1000),
                )
            waited, last = True, got
            await asyncio.sleep(min(_POLL_S, max(0.005, got.ttl_left_ms / 1000)))
        resumed = await self._run(self.tier.resume, got)
        if resumed.taken_over:
            self._takeovers[key] = (resumed, time.monotonic() - t0 if waited else 0.0)
        return resumed

    async def _take(self, key: PageKey) -> Held | LeaseHolder:
        try:
            return await self._run(self.tier.take, key)
        except TierUnavailable as err:
            self.tier.stats.count(n_unavailable=1)
            raise MindUnavailable(
                "the shared tier (Redis) cannot be reached, and this replica does not hold "
                f"this mind ({err})",
                retry_after_s=1.0,
            ) from err

    def _refuse_or_forward(
        self,
        key: PageKey,
        holder: LeaseHolder,
        last: LeaseHolder | None,
        turn: turns.TurnContext | None,
    ) -> None:
        """Forward the turn to a holder that may be alive; refuse a forwarded turn whose
        holder is alive; else return (the caller waits the lease out)."""
        past_life = holder.advertise_url == self.tier.incarnation.advertise_url
        failed = turn is not None and holder.token in turn.failed_owners
        hop = turn is not None and bool(turn.hop)
        if turn is not None and not (past_life or failed or hop):
            owner = Owner(key, holder.replica_id, holder.advertise_url, holder.token)
            raise ForwardTurn(owner)
        renewed = (
            last is not None
            and last.token == holder.token
            and holder.ttl_left_ms > last.ttl_left_ms
        )
        if hop and renewed:
            self.tier.stats.count(n_unavailable=1)
            raise MindUnavailable(
                f"the mind is owned by {holder.replica_id}, alive; this turn was forwarded here "
                f"by {turn.hop if turn else '?'}, and a forwarded turn is not forwarded again",
                retry_after_s=1.0,
            )

    # -- the forwarder's side ----------------------------------------------------------------

    async def watch_owner(self, owner: Owner) -> None:
        """Returns once the owner a turn was forwarded to has lost the mind's lease."""
        while True:
            await asyncio.sleep(_WATCH_S)
            try:
                holder = await self._run(self.tier.holder, owner.key)
            except TierUnavailable:
                continue  # cannot tell: keep waiting for the owner's answer
            if holder is None or holder.token != owner.token:
                return

    def forwarded(self, owner: Owner, *, ok: bool) -> None:
        self.tier.stats.count(n_forwarded=int(ok), n_forward_failed=int(not ok))

    def expect_handoff(self, key: PageKey, asked: asyncio.Future[None]) -> None:
        """A hand-off of the mind was asked of its owner: the mind's next turn waits for it."""
        self.tier.stats.count(n_handoffs_asked=1)
        self._handoffs[key] = asked
        asked.add_done_callback(lambda _: self._handoffs.pop(key, None))

    async def view(self) -> TierView:
        """The tier's state for /pages and /metrics (read off the event loop)."""
        return await self._run(self.tier.view)

    # -- the owner's side --------------------------------------------------------------------

    async def hand_off(self, key: PageKey) -> bool:
        """Publish the mind, release its lease, forget it here (the caller holds the mind)."""
        done = await self._run(self.tier.hand_off, key)
        if done:
            log.info("mind %s handed off", key.name)
        return done

    async def ended(self, key: PageKey) -> None:
        """A slot verb ended the mind here (erase, page_out): the shared tier drops it too, so
        its next turn anywhere starts it fresh. Redis away: it stays there (logged)."""
        try:
            await self._run(self.tier.end_mind, key)
        except TierUnavailable as err:
            log.error(
                "mind %s: ended here, but the shared tier could not drop it (%s): a later "
                "turn may resume it from there",
                key.name,
                err,
            )

    # -- after a turn ------------------------------------------------------------------------

    async def turn_done(
        self, request: GenerationRequest, completion: Completion
    ) -> Completion | EngineError:
        """Write the turn's end (see the module docstring); the event to answer with."""
        key = request.mind
        assert key is not None
        prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
        tokens = np.concatenate([prompt, np.asarray(completion.tokens, dtype=np.int32)])
        tokens = tokens[: completion.n_tokens_cached]
        turn = turns.current()
        turn_id = (
            turn.turn_id
            if turn is not None
            else "tokens:" + hashlib.sha256(tokens.tobytes()).hexdigest()[:32]
        )
        error = await self._run(self.tier.end_turn, key, turn_id, tokens)
        takeover = self._takeovers.pop(key, None)
        if takeover is not None:
            self._count_takeover(key, prompt, completion, turn_id, *takeover)
        if error is None:
            return completion
        await self._run(self.tier.forget, key)
        return EngineError(completion.req_id, ErrorKind.UNAVAILABLE, f"{error}; retry the turn")

    def _count_takeover(
        self,
        key: PageKey,
        prompt: np.ndarray,
        completion: Completion,
        turn_id: str,
        resumed: Resumed,
        lease_wait_s: float,
    ) -> None:
        # What the mind held before this turn: its token log; for a retry of a turn its dead
        # owner had logged already (the log ends with this turn), what the restored page held.
        known = resumed.tokens_known
        if turn_id == resumed.last_turn:
            known = resumed.page_tokens
        n = min(len(known), len(prompt))
        same = np.flatnonzero(known[:n] != prompt[:n])
        n_known = int(same[0]) if len(same) else n
        n_reprefilled = max(0, min(n_known, len(prompt) - 1) - completion.timings.cache_n)
        restore_ms = self.registry.pop_restore_ms(key) or 0.0
        self.tier.stats.count(
            n_resumes=1,
            n_resumes_tier=int(resumed.source == "tier"),
            n_resumes_fallback=int(resumed.source != "tier"),
            lease_wait_s=lease_wait_s,
            fetch_s=resumed.fetch_s,
            verify_s=resumed.verify_s,
            restore_s=restore_ms / 1e3,
            prefill_s=completion.timings.prompt_ms / 1e3,
            n_reprefilled_tokens=n_reprefilled,
        )
        log.info(
            "mind %s resumed from %s%s: lease wait %.0f ms, fetch %.0f ms (verify %.0f), "
            "restore %.1f ms, prefill %d tokens in %.0f ms (%d of them known before)",
            key.name,
            {"tier": "the shared tier", "local": "its copy here", "none": "its prompt"}[
                resumed.source
            ],
            f" after a miss ({resumed.miss})" if resumed.miss else "",
            lease_wait_s * 1e3,
            resumed.fetch_s * 1e3,
            resumed.verify_s * 1e3,
            restore_ms,
            completion.timings.prompt_n,
            completion.timings.prompt_ms,
            n_reprefilled,
        )
