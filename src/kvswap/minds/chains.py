"""Stored conversations on minds, on the event loop: which mind a stored turn runs on, the
state a fork starts from, the turn's write before its answer, and minds let go.

A chain of responses is a mind. `start` reads what a turn continues (`previous_response_id`,
a `conversation`, or nothing) and decides where it runs:
- a new chain (`store` true, nothing to continue): a new mind the store makes (`chain-...`),
  or the mind the request names;
- a response that is its mind's newest position: that mind, continued;
- an older response: a fork, a new mind that starts from a copy of the old mind's state
  (`seed`: its RAM page, or its disk copy; the engine cuts it to the longest prefix the fork's
  prompt shares, restoring the nearest checkpoint first where the memory cannot be cut);
  the old mind is untouched;
- a conversation: the conversation's own mind.
`record` writes the turn (on an I/O thread) before its answer goes out, and drops the state of
every mind the retention let go (`release`: its slot erased, its RAM page and files removed,
as a client's `drop`). The counters say how each turn's prompt was made (`/metrics`). The
typed errors of a request that names what is not the caller's are OpenAI's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, mind_key
from kvswap.core.page import state_of_page
from kvswap.core.vocab import MindMove, MindTier
from kvswap.engine.client import EngineClient
from kvswap.engine.commands import MindVerb
from kvswap.minds.continuation import ContinueMode
from kvswap.minds.session import MindSession, Seed
from kvswap.minds.stored.records import (
    Chain,
    ConversationNotFound,
    Item,
    PreviousResponseNotFound,
    TurnWrite,
)
from kvswap.minds.stored.retention import Released
from kvswap.minds.stored.store import StoredRecords

log = logging.getLogger("kvswap.minds")
T = TypeVar("T")


@dataclass(frozen=True)
class ChainStart:
    """Where a stored (or chained) turn runs, and the history it continues."""

    mind: PageKey | None  # None: no mind (a turn neither stored nor continuing one)
    owned: bool  # the store made the mind
    base: Chain | None  # the response it continues (its tokens and position)
    items: list[Item]  # the history before this request's input, oldest first
    n_covered: int  # ... of them, those the base's tokens hold
    n_dropped: int  # leading items the prompt leaves out (`truncation: auto`)
    previous: str | None  # previous_response_id
    conversation: str | None
    fork_from: PageKey | None  # a fork: the mind whose state it starts from
    record: bool  # `store`: the turn is written
    why_rendered: str = ""  # why a turn with history has no base to continue


@dataclass
class ChainCounters:
    """How stored turns were made (`/metrics`)."""

    turns: dict[ContinueMode, int] = field(default_factory=lambda: dict.fromkeys(ContinueMode, 0))
    n_forks: int = 0
    n_released: int = 0


def new_mind_name(prefix: str = "chain") -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


class StoredChains:
    """See the module docstring."""

    def __init__(
        self, records: StoredRecords, *, session: MindSession, client: EngineClient, io: Executor
    ) -> None:
        self.records = records
        self.session = session
        self.client = client
        self.io = io
        self.counters = ChainCounters()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """A store call, on the I/O executor."""
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    async def start(
        self,
        namespace: str,
        *,
        previous: str | None,
        conversation: str | None,
        store: bool,
        named: PageKey | None,
    ) -> ChainStart:
        """Where the turn runs (see the module docstring); typed 400/404s for what the caller
        cannot continue."""
        if previous is not None and conversation is not None:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'.",
                param="previous_response_id",
            )
        if conversation is not None:
            return await self._in_conversation(namespace, conversation, store)
        if previous is None:
            mind = named or (mind_key(namespace, new_mind_name()) if store else None)
            return ChainStart(mind, named is None and store, None, [], 0, 0, None, None, None,
                              store)  # fmt: skip
        base = await self.run(self.records.chain, namespace, previous)
        if base is None:
            raise PreviousResponseNotFound(previous)
        own = mind_key(namespace, base.response.mind)
        if named is not None and named != own:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"the request names mind {named.name!r}, but previous_response_id continues "
                f"mind {own.name!r}: name that mind, or none",
                param="mind",
            )
        items, n_dropped = base.items, base.response.n_dropped
        if base.is_head:
            return ChainStart(own, False, base, items, len(items), n_dropped, previous, None,
                              None, store)  # fmt: skip
        fork = mind_key(namespace, new_mind_name()) if store else None
        return ChainStart(fork, store, base, items, len(items), n_dropped, previous, None,
                          own if store else None, store)  # fmt: skip

    async def _in_conversation(self, namespace: str, conv_id: str, store: bool) -> ChainStart:
        turn = await self.run(self.records.conversation_turn, namespace, conv_id)
        if turn is None:
            raise ConversationNotFound(conv_id, param="conversation")
        conv = turn.conversation
        n_dropped = turn.head.response.n_dropped if turn.head is not None else 0
        why = ""
        if turn.head is None and conv.head is not None:
            why = "an item the conversation's mind held was deleted"
        return ChainStart(
            mind_key(namespace, conv.mind), True, turn.head, turn.items, turn.n_covered,
            n_dropped, None, conv.id, None, store, why,
        )  # fmt: skip

    async def seed(self, src: PageKey) -> Seed | None:
        """A copy of mind `src`'s state for a fork (its RAM page held, or its disk copy read;
        a resident mind is paged out to RAM first); None when it holds none here."""
        session = self.session
        self.counters.n_forks += 1
        async with session.hold(src):
            tier = session.tier(src)
            if tier is MindTier.SLOT:
                moved: int = await self.client.call(
                    lambda rid, reply: MindVerb(rid, src, MindMove.TO_RAM, reply)
                )
                assert moved == -1, "a mind paged out is in no slot"
                tier = session.tier(src)
            store = session.store
            if tier is MindTier.RAM and store is not None and store.has(src):
                page = store.hold(src)
                if page.layout.token_only:
                    store.release(page)
                    return None
                view = page.view()
                state = state_of_page(view, page.layout)

                def close() -> None:
                    state.release()
                    view.release()
                    store.release(page)

                return Seed(state, close)
            if tier is MindTier.DISK:
                read = await session.read_state(src)
                return Seed(read.state, read.close) if read is not None else None
        return None

    async def record(self, write: TurnWrite, mode: ContinueMode) -> None:
        """Write a stored turn (before its answer goes out); drop what the retention let go."""
        self.counters.turns[mode] += 1
        released = await self.run(self.records.record, write)
        await self.release(released + self.records.take_released())

    async def delete_response(self, namespace: str, rid: str) -> bool:
        """Delete (hide) a stored response of the caller's; False when there is none. Its
        descendants keep working; a mind it was the last reference to is dropped."""
        found, released = await self.run(self.records.delete_response, namespace, rid)
        await self.release(released)
        return found

    async def delete_conversation(self, namespace: str, conv_id: str) -> bool:
        """Delete a conversation of the caller's and its items; its mind is dropped once no
        stored response references it either."""
        found, released = await self.run(self.records.delete_conversation, namespace, conv_id)
        await self.release(released)
        return found

    async def release(self, released: list[Released]) -> None:
        """Drop the state of the minds no record references any more (those the store made)."""
        for gone in released:
            self.counters.n_released += 1
            if gone.owned:
                await self._drop(mind_key(gone.namespace, gone.name))

    async def _drop(self, key: PageKey) -> None:
        session = self.session
        if session.tier(key) is None:
            return
        async with session.hold(key):
            erased: int = await self.client.call(
                lambda rid, reply: MindVerb(rid, key, MindMove.ERASE, reply)
            )
            assert erased == -1, "an erased mind is in no slot"
            if session.store is not None:
                session.store.remove(key)
        await session.forget(key)
        log.info("mind %s: no stored response references it any more: dropped", key.name)

    async def sweep(self) -> None:
        """Apply the retention now (time to live, byte budget)."""
        await self.release(await self.run(self.records.sweep))

    async def sweep_forever(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("the stored conversations' sweep failed; retried later")
