"""A mind's turns against the shared tier, on the event loop: the asyncio face of `SharedTier`.

`SharedTier` blocks on Redis and on the engine's answers; `SharedMinds` runs its calls on a
pool of worker threads and adds what a turn needs around them:
- before a turn (`place`, in the mind's session, under its lock): a hand-off asked of the
  mind's owner is waited for first (then the mind is taken with no re-prefill); the lease is
  made ours (`placement.place`: serve, forward, wait out, refuse) and the mind resumed
  (`SharedTier.resume`: nothing to do when it was ours, else the tier's page or a fallback);
- the forwarder's questions: is the owner a turn went to still the owner (`watch_owner`), a
  forward's outcome counted, a hand-off asked after a forwarded turn (`expect_handoff`);
- the owner's side: a hand-off (`hand_off`), a mind ended by a slot verb (`ended`);
- after a turn (`turn_done`, before its answer goes out): the token log written through with
  the chat turn's record (`minds.turnrecord`) and the page published past the RPO bound; a mind lost meanwhile fails the turn (503) and its
  copies here are dropped; a takeover's costs are counted (`figures.takeover_figures`).

Owns the worker threads and the pending hand-offs. Redis away: `MindUnavailable` (503 with
Retry-After) for a mind not held here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

import numpy as np

from kvswap.core.errors import ErrorKind, MindUnavailable
from kvswap.core.keys import PageKey
from kvswap.core.types import Completion, EngineError, GenerationRequest
from kvswap.minds import figures, placement
from kvswap.minds.histories import last_turn
from kvswap.minds.placement import Owner, TurnFacts
from kvswap.minds.turnrecord import encode_record
from kvswap.tiers.shared.errors import TierUnavailable
from kvswap.tiers.shared.replica import Holder, Placement, Resumed, SharedTier, TierView

log = logging.getLogger("kvswap.cluster")

T = TypeVar("T")
WATCH_S: Final = 0.25  # how often the lease of an owner a turn was forwarded to is looked at
_N_THREADS: Final = 8  # Redis round trips of concurrent turns (leases, fetches, appends)


class SharedMinds:
    """See the module docstring."""

    def __init__(self, tier: SharedTier, *, watch_s: float = WATCH_S) -> None:
        self.tier = tier
        self.watch_s = watch_s
        self._pool = ThreadPoolExecutor(_N_THREADS, thread_name_prefix="kvswap-shared")
        self._handoffs: dict[PageKey, asyncio.Future[None]] = {}

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    @property
    def replica_id(self) -> str:
        return self.tier.replica_id

    # -- the lease side of `placement.place` ------------------------------------------------

    @property
    def lease_s(self) -> float:
        return self.tier.lease_s

    def is_me(self, holder: Holder) -> bool:
        return self.tier.is_me(holder)

    def count(self, **deltas: float) -> None:
        self.tier.count(**deltas)

    async def take(self, key: PageKey) -> Placement:
        try:
            return await self._run(self.tier.take, key)
        except TierUnavailable as err:
            self.tier.count(n_unavailable=1)
            raise MindUnavailable(
                "the shared tier (Redis) cannot be reached, and this replica does not hold "
                f"this mind ({err})",
                retry_after_s=1.0,
            ) from err

    # -- before a turn ----------------------------------------------------------------------

    async def place(self, key: PageKey, facts: TurnFacts | None) -> tuple[Resumed, float]:
        """Make the mind ours for this turn: how it starts, and the seconds a lease was waited
        out for a takeover (see the module docstring)."""
        handoff = self._handoffs.get(key)
        if handoff is not None:
            await asyncio.wait({handoff}, timeout=self.lease_s)
        got, waited_s = await placement.place(self, key, facts)
        resumed = await self._run(self.tier.resume, got)
        return resumed, waited_s if resumed.taken_over else 0.0

    async def to_owner(self, key: PageKey, facts: TurnFacts | None) -> None:
        """A read of the mind (its history) goes to its owner: raises OwnedElsewhere when
        another live replica holds its lease and the request may be forwarded (no lease is
        taken here; Redis away or no owner: the read is this replica's)."""
        try:
            holder = await self._run(self.tier.holder, key)
        except TierUnavailable:
            return
        if holder is None or facts is None or facts.hop or self.is_me(holder):
            return
        if holder.token not in facts.failed_owners:
            raise placement.OwnedElsewhere(Owner.of(key, holder))

    # -- the forwarder's side ---------------------------------------------------------------

    async def watch_owner(self, owner: Owner) -> None:
        """Returns once the owner a turn was forwarded to has lost the mind's lease."""
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                holder = await self._run(self.tier.holder, owner.key)
            except TierUnavailable:
                continue  # cannot tell: keep waiting for the owner's answer
            if holder is None or holder.token != owner.token:
                return

    def forwarded(self, owner: Owner, *, ok: bool) -> None:
        self.tier.count(n_forwarded=int(ok), n_forward_failed=int(not ok))

    def expect_handoff(self, key: PageKey, asked: asyncio.Future[None]) -> None:
        """A hand-off of the mind was asked of its owner: the mind's next turn waits for it."""
        self.tier.count(n_handoffs_asked=1)
        self._handoffs[key] = asked
        asked.add_done_callback(lambda _: self._handoffs.pop(key, None))

    async def view(self) -> TierView:
        """The tier's state for /pages and /metrics (read off the event loop)."""
        return await self._run(self.tier.view)

    # -- the owner's side -------------------------------------------------------------------

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

    # -- after a turn -----------------------------------------------------------------------

    async def turn_done(
        self,
        request: GenerationRequest,
        completion: Completion,
        *,
        facts: TurnFacts | None,
        resumed: Resumed | None,
        lease_wait_s: float,
        restore_ms: float,
    ) -> Completion | EngineError:
        """Write the turn's end (see the module docstring); the event to answer with."""
        key = request.mind
        assert key is not None
        prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
        tokens = figures.kv_tokens(prompt, completion)
        this_turn = figures.turn_id(facts, tokens)
        mark = request.turn_mark
        chat = b""
        if mark is not None and not completion.cancelled:
            turn = last_turn(request.prompt_tokens, completion, mark)
            chat = encode_record(this_turn, turn, len(tokens))
        error = await self._run(self.tier.end_turn, key, this_turn, tokens, chat)
        if resumed is not None and resumed.taken_over:
            taken = figures.takeover_figures(
                resumed,
                prompt,
                completion,
                this_turn,
                lease_wait_s=lease_wait_s,
                restore_ms=restore_ms,
            )
            self.tier.count(**taken.counts())
            log.info("mind %s %s", key.name, taken.describe())
        if error is None:
            return completion
        await self._run(self.tier.forget, key)
        return EngineError(completion.req_id, ErrorKind.UNAVAILABLE, f"{error}; retry the turn")
