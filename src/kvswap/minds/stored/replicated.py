"""The stored conversations of a cluster: every replica's writes go through one log in the
shared tier, and each replica keeps an in-memory mirror of the database that replays it.

`ReplicatedRecords` answers exactly as `StoredRecords` (it is one, over its mirror): a write is
serialized, appended to the log (fenced by its mind's lease when this replica holds the mind:
`SharedTier.append_record`), then every entry not yet applied, this one included, is applied
to the mirror in the log's order at the time it was made, so every replica computes the same
records (segment ids, retention, the budget's victims). A read first catches up. So any
replica continues any chain, and a replica that starts replays the whole log.

The minds another replica's write let go are kept (`take_released`) for `StoredChains` to drop here
too, where this replica holds their state. Blocks on Redis: called on I/O threads, as the
store. Pure JSON on the wire (tokens as base64 little-endian int32).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kvswap.core.keys import PageKey, mind_key
from kvswap.minds.continuation import Position
from kvswap.minds.stored.records import ResponseRecord, Segment, TurnWrite
from kvswap.minds.stored.retention import Released
from kvswap.minds.stored.store import StoredRecords
from kvswap.tiers.shared.errors import TierUnavailable

log = logging.getLogger("kvswap.minds")


class RecordLog(Protocol):
    """The shared tier's records log (`tiers.shared.replica.SharedTier` is one)."""

    def append_record(self, op: bytes, mind: PageKey | None) -> str: ...

    def read_records(self, after: str) -> list[tuple[str, bytes]]: ...


def turn_json(turn: TurnWrite) -> dict[str, Any]:
    rec = dataclasses.asdict(turn.response)
    seg = turn.segment
    tokens = np.ascontiguousarray(seg.tokens, dtype="<i4").tobytes()
    return {
        "namespace": turn.namespace,
        "mind": turn.mind,
        "owned": turn.owned,
        "response": rec,
        "segment": {"parent": seg.parent, "n_from": seg.n_from,
                    "tokens": base64.b64encode(tokens).decode()},
        "events": turn.events,
    }  # fmt: skip


def turn_of(data: dict[str, Any]) -> TurnWrite:
    rec = dict(data["response"])
    rec["position"] = Position(**rec["position"])
    seg = data["segment"]
    tokens = np.frombuffer(base64.b64decode(seg["tokens"]), dtype="<i4").astype(np.int32)
    return TurnWrite(
        data["namespace"],
        data["mind"],
        data["owned"],
        ResponseRecord(**rec),
        Segment(seg["parent"], seg["n_from"], tokens),
        data["events"],
    )


def _caught_up(name: str) -> Any:
    """`StoredRecords`'s read `name`, once the mirror has caught up with the log."""
    read = getattr(StoredRecords, name)

    def method(self: ReplicatedRecords, *args: Any) -> Any:
        self.catch_up()
        return read(self, *args)

    method.__name__ = name
    method.__doc__ = read.__doc__
    return method


class ReplicatedRecords(StoredRecords):
    """See the module docstring."""

    def __init__(
        self,
        records: RecordLog,
        *,
        ttl_s: float,
        budget_bytes: int | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(None, ttl_s=ttl_s, budget_bytes=budget_bytes, clock=clock)
        self.records = records
        self._applied = "0"
        self._lock = threading.RLock()
        self._elsewhere: list[Released] = []
        self._appliers: dict[str, Callable[[dict[str, Any], float], Any]] = {
            "record": lambda a, now: StoredRecords.record(self, turn_of(a["turn"]), now),
            "put_pending": lambda a, now: StoredRecords.put_pending(self, **a, now=now),
            "delete_response": lambda a, now: StoredRecords.delete_response(self, **a, now=now),
            "create_conversation": lambda a, now: StoredRecords.create_conversation(
                self, **a, now=now
            ),
            "update_conversation": lambda a, now: StoredRecords.update_conversation(
                self, **a, now=now
            ),
            "delete_conversation": lambda a, now: StoredRecords.delete_conversation(
                self, **a, now=now
            ),
            "add_items": lambda a, now: StoredRecords.add_items(self, **a, now=now),
            "delete_conversation_item": lambda a, now: StoredRecords.delete_conversation_item(
                self, **a, now=now
            ),
        }

    def describe(self) -> str:
        return (
            "stored conversations in the shared tier's log (a mirror in memory here): "
            f"responses kept {self.ttl_s:.0f} s"
        )

    # -- the log ------------------------------------------------------------------------------

    def catch_up(self) -> dict[str, Any]:
        """Apply every entry of the log not applied yet; their results by entry id."""
        results: dict[str, Any] = {}
        with self._lock:
            for entry_id, raw in self.records.read_records(self._applied):
                op = json.loads(raw)
                try:
                    results[entry_id] = self._appliers[op["op"]](op["args"], op["now"])
                except Exception:  # one bad entry must not wedge every replica's mirror
                    log.exception("stored conversations: log entry %s not applied", entry_id)
                self._applied = entry_id
        return results

    def _write(self, name: str, args: dict[str, Any], mind: PageKey | None = None) -> Any:
        op = {"op": name, "now": self.clock(), "args": args}
        with self._lock:
            entry_id = self.records.append_record(json.dumps(op).encode(), mind)
            results = self.catch_up()
        for other, result in results.items():
            if other != entry_id:
                self._elsewhere += _released(result)
        return results.get(entry_id)

    def take_released(self) -> list[Released]:
        """The minds other replicas' writes let go since the last call."""
        with self._lock:
            out, self._elsewhere = self._elsewhere, []
        return out

    # -- writes: through the log --------------------------------------------------------------

    def record(self, turn: TurnWrite, now: float | None = None) -> list[Released]:
        mind = mind_key(turn.namespace, turn.mind)
        return list(self._write("record", {"turn": turn_json(turn)}, mind) or [])

    def put_pending(self, ns: str, rid: str, body: Any, events: Any, now: Any = None) -> None:
        self._write("put_pending", {"ns": ns, "rid": rid, "body": body, "events": events})

    def delete_response(self, ns: str, rid: str, now: Any = None) -> tuple[bool, list[Released]]:
        result = self._write("delete_response", {"ns": ns, "rid": rid})
        return result if result is not None else (False, [])

    def create_conversation(
        self, ns: str, conv_id: str, items: Any, metadata: Any, now: Any = None
    ) -> Any:
        self.catch_up()
        self.check_fits(ns, None, items)
        args = {"ns": ns, "conv_id": conv_id, "items": items, "metadata": metadata}
        return self._write("create_conversation", args)

    def update_conversation(self, ns: str, conv_id: str, metadata: Any, now: Any = None) -> Any:
        args = {"ns": ns, "conv_id": conv_id, "metadata": metadata}
        return self._write("update_conversation", args)

    def delete_conversation(self, ns: str, conv_id: str, now: Any = None) -> Any:
        result = self._write("delete_conversation", {"ns": ns, "conv_id": conv_id})
        return result if result is not None else (False, [])

    def add_items(self, ns: str, conv_id: str, items: Any, now: Any = None) -> bool:
        self.catch_up()
        self.check_fits(ns, conv_id, items)
        return bool(self._write("add_items", {"ns": ns, "conv_id": conv_id, "items": items}))

    def delete_conversation_item(self, ns: str, conv_id: str, item_id: str, now: Any = None) -> Any:
        args = {"ns": ns, "conv_id": conv_id, "item_id": item_id}
        return self._write("delete_conversation_item", args)

    # -- reads: caught up first ---------------------------------------------------------------

    chain = _caught_up("chain")
    response = _caught_up("response")
    events = _caught_up("events")
    input_items = _caught_up("input_items")

    def listing(self, ns: str) -> dict[str, Any]:
        """The caller's stored chains for `/pages`: with the log out of reach (Redis down), what
        the mirror holds, marked `log_reachable: false`, so the page still answers."""
        try:
            self.catch_up()
            reachable = True
        except TierUnavailable as e:
            log.debug("stored conversations: listed from the mirror, the log out of reach: %s", e)
            reachable = False
        return {**StoredRecords.listing(self, ns), "log_reachable": reachable}

    conversation = _caught_up("conversation")
    conversation_items = _caught_up("conversation_items")
    conversation_item = _caught_up("conversation_item")
    conversation_turn = _caught_up("conversation_turn")

    def sweep(self) -> list[Released]:
        self.catch_up()
        return super().sweep() + self.take_released()


def _released(result: Any) -> list[Released]:
    """The minds an applied write let go (its result, or the second of a pair)."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], list):
        return [r for r in result[1] if isinstance(r, Released)]
    if isinstance(result, list):
        return [r for r in result if isinstance(r, Released)]
    return []
