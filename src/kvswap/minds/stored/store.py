"""`StoredRecords`: the stored conversations of one server, as the minds layer calls them.

Every method is one transaction on the database (`db.RecordsDb`) and blocks (the caller runs it
on an I/O thread): reads see the caller's namespace only, a turn's write goes in whole, and
every write first applies the retention (`retention`: time to live, then the byte budget),
answering the minds no record references any more (`Released`), whose state the caller drops.
The clock is injected (tests move it). Built by the server at start-up: on a file under the
state folder, or in memory without one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvswap.minds.stored import conversations as convs
from kvswap.minds.stored import responses as resps
from kvswap.minds.stored import retention
from kvswap.minds.stored.db import DB_NAME, RecordsDb
from kvswap.minds.stored.records import Chain, ConversationRecord, Item, TurnWrite
from kvswap.minds.stored.retention import Released

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class ConversationTurn:
    """A conversation as its next turn needs it: its items, and its head's chain when the
    head's tokens still cover the first `n_covered` of them."""

    conversation: ConversationRecord
    items: list[Item]
    head: Chain | None
    n_covered: int


class StoredRecords:
    """See the module docstring."""

    def __init__(
        self,
        folder: Path | None,
        *,
        ttl_s: float,
        budget_bytes: int | None,
        clock: Clock = time.time,
    ) -> None:
        self.path = folder / DB_NAME if folder is not None else None
        self.db = RecordsDb(self.path)
        self.ttl_s = ttl_s
        self.budget_bytes = budget_bytes
        self.clock = clock
        if folder is not None:  # this process owns the file: no run of another is live
            with self.db.write() as conn:
                retention.interrupted(conn)

    def describe(self) -> str:
        where = f"in {self.path}" if self.path is not None else "in memory (lost at exit)"
        budget = f"{self.budget_bytes} bytes" if self.budget_bytes is not None else "no bound"
        return f"stored conversations {where}: responses kept {self.ttl_s:.0f} s, budget {budget}"

    def close(self) -> None:
        self.db.close()

    # -- responses ------------------------------------------------------------------------

    def chain(self, ns: str, rid: str) -> Chain | None:
        with self.db.read() as conn:
            return resps.chain(conn, ns, rid, self.clock())

    def response(self, ns: str, rid: str) -> dict[str, Any] | None:
        """The object GET shows: a stored response's, or a running background one's."""
        with self.db.read() as conn:
            record = resps.visible(conn, ns, rid, self.clock())
            return record.body if record is not None else resps.pending_body(conn, ns, rid)

    def events(self, ns: str, rid: str) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            return resps.events_of(conn, ns, rid, self.clock())

    def input_items(self, ns: str, rid: str) -> list[Item] | None:
        """The items a response was made from (its history and its input, oldest first)."""
        with self.db.read() as conn:
            record = resps.visible(conn, ns, rid, self.clock())
            if record is None:
                return None
            items = resps.history(conn, record)
            return items[: len(items) - len(record.output)]

    def record(self, turn: TurnWrite, now: float | None = None) -> list[Released]:
        """Write a stored turn (and in a conversation, its items); the minds let go. `now`:
        the write's time (a replicated write is applied at the time it was made)."""
        now = self.clock() if now is None else now
        with self.db.write() as conn:
            released = self._retain(conn, now)
            rec = turn.response
            if rec.conversation is not None:
                first = convs.append(conn, rec.conversation, rec.input + rec.output)
                turn = dataclasses.replace(turn, response=dataclasses.replace(rec, conv_seq=first))
            resps.write_turn(conn, turn, now, self.ttl_s)
            if rec.conversation is not None:
                convs.turn_done(conn, rec.conversation, rec.id, now)
            keep = (turn.namespace, turn.mind)
            return released + retention.within_budget(conn, self.budget_bytes, keep)

    def put_pending(
        self,
        ns: str,
        rid: str,
        body: dict[str, Any],
        events: list[dict[str, Any]],
        now: float | None = None,
    ) -> None:
        """A background response's state while it runs (GET reads it)."""
        with self.db.write() as conn:
            resps.put_pending(conn, ns, rid, body, events, self._now(now))

    def delete_response(
        self, ns: str, rid: str, now: float | None = None
    ) -> tuple[bool, list[Released]]:
        now = self._now(now)
        with self.db.write() as conn:
            found = resps.hide(conn, ns, rid, now)
            return found, self._retain(conn, now) if found else []

    def take_released(self) -> list[Released]:
        """Minds let go by writes made elsewhere (a cluster's other replicas); none here."""
        return []

    def sweep(self) -> list[Released]:
        """Apply the retention now (the periodic sweep)."""
        with self.db.write() as conn:
            released = self._retain(conn, self.clock()) + retention.within_budget(
                conn, self.budget_bytes
            )
        self.db.compact()
        return released

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else now

    def _retain(self, conn: Any, now: float) -> list[Released]:
        retention.expire(conn, now, self.ttl_s)
        return retention.collect(conn)

    def listing(self, ns: str) -> dict[str, Any]:
        """The caller's stored chains and conversations, its bytes and its share of the budget
        (never another tenant's figures)."""
        with self.db.read() as conn:
            budget = self.budget_bytes
            return {
                "chains": resps.chains_of(conn, ns),
                "conversations": convs.listed(conn, ns),
                "n_bytes": retention.tenant_bytes(conn).get(ns, 0),
                "budget_bytes": retention.share_bytes(conn, budget, ns) if budget else budget,
            }

    # -- conversations --------------------------------------------------------------------

    def create_conversation(
        self,
        ns: str,
        conv_id: str,
        items: list[Item],
        metadata: dict[str, str],
        now: float | None = None,
    ) -> ConversationRecord:
        with self.db.write() as conn:
            retention.check_fits(conn, self.budget_bytes, ns, None, _bodies(items), "items")
            convs.create(conn, ns, conv_id, metadata, self._now(now))
            convs.append(conn, conv_id, items)
            retention.within_budget(conn, self.budget_bytes, (ns, conv_id))
            rec = convs.get(conn, ns, conv_id)
        assert rec is not None
        return rec

    def check_fits(self, ns: str, conv_id: str | None, items: list[Item]) -> None:
        """Refuse (`RecordsTooLarge`) items that would make conversation `conv_id` (None: a new
        one) larger than the caller's share (a write checks this itself; a cluster's replica
        asks first, so that a refused write never enters the log)."""
        with self.db.read() as conn:
            retention.check_fits(conn, self.budget_bytes, ns, conv_id, _bodies(items), "items")

    def conversation(self, ns: str, conv_id: str) -> ConversationRecord | None:
        with self.db.read() as conn:
            return convs.get(conn, ns, conv_id)

    def update_conversation(
        self, ns: str, conv_id: str, metadata: dict[str, str], now: float | None = None
    ) -> ConversationRecord | None:
        with self.db.write() as conn:
            if convs.get(conn, ns, conv_id) is None:
                return None
            convs.set_metadata(conn, conv_id, metadata)
            return convs.get(conn, ns, conv_id)

    def delete_conversation(
        self, ns: str, conv_id: str, now: float | None = None
    ) -> tuple[bool, list[Released]]:
        now = self._now(now)
        with self.db.write() as conn:
            if convs.get(conn, ns, conv_id) is None:
                return False, []
            convs.delete(conn, conv_id)
            return True, self._retain(conn, now)

    def add_items(self, ns: str, conv_id: str, items: list[Item], now: float | None = None) -> bool:
        """Append items to the caller's conversation (False: it has none of that id); refused
        (`RecordsTooLarge`) when they would make it larger than the caller's share."""
        with self.db.write() as conn:
            conv = convs.get(conn, ns, conv_id)
            if conv is None:
                return False
            retention.check_fits(conn, self.budget_bytes, ns, conv_id, _bodies(items), "items")
            convs.append(conn, conv_id, items)
            retention.within_budget(conn, self.budget_bytes, (ns, conv.mind))
            return True

    def conversation_items(self, ns: str, conv_id: str) -> list[Item] | None:
        with self.db.read() as conn:
            if convs.get(conn, ns, conv_id) is None:
                return None
            return [item for _, item in convs.items(conn, conv_id)]

    def conversation_item(self, ns: str, conv_id: str, item_id: str) -> Item | None:
        with self.db.read() as conn:
            if convs.get(conn, ns, conv_id) is None:
                return None
            return convs.item(conn, conv_id, item_id)

    def delete_conversation_item(
        self, ns: str, conv_id: str, item_id: str, now: float | None = None
    ) -> ConversationRecord | None:
        """The conversation after the delete; None when it or the item is not the caller's."""
        with self.db.write() as conn:
            conv = convs.get(conn, ns, conv_id)
            if conv is None or not convs.delete_item(conn, conv, item_id):
                return None
            return convs.get(conn, ns, conv_id)

    def conversation_turn(self, ns: str, conv_id: str) -> ConversationTurn | None:
        now = self.clock()
        with self.db.read() as conn:
            conv = convs.get(conn, ns, conv_id)
            if conv is None:
                return None
            listed = convs.items(conn, conv_id)
            head = None
            if conv.head is not None and conv.intact:
                # A deleted head stays the conversation's position (the conversation
                # references it, so the retention keeps it).
                record = resps.visible(conn, ns, conv.head, now) or resps.kept(conn, conv.head)
                head = resps.chain_of(conn, record) if record is not None else None
            n_covered = sum(1 for seq, _ in listed if seq < conv.covered_seq)
            return ConversationTurn(conv, [item for _, item in listed], head, n_covered)


def _bodies(items: list[Item]) -> list[str]:
    """Items as the database stores them (their JSON), for the budget's count."""
    return [json.dumps(item) for item in items]
