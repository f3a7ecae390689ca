"""A mind's token log in the shared tier, written through at the end of every turn.

`kv:{h}:tokens` holds the conversation's tokens (int32 little-endian). A turn appends what it
added on top of the `n_base` tokens it started from: when the log is longer, the request wins
and the log is cut back to `n_base` first (a client that resent an edited history); when it is
shorter, the append is refused (`TokenLogGap`: the caller rewrites the log from 0). Each append
carries a turn id (the client's `X-Request-Id`, else a hash of the request); the latest 64 ids
are kept, and a replayed id changes nothing, so a client that retries a turn whose answer it
lost applies it once. Every append is one script that checks the lease and fence first.
A chat turn's append also sets `kv:{h}:chat`, its record for the next turn's prompt
(`minds.turnrecord`, naming the turn id it belongs to); any other turn's removes it.

The page published with the log (`store`) records how many of these tokens its KV holds;
a replica resuming the mind prefills only `log[n_tokens:]`.

Owns `TokenLog`. Thread-safe. Raises `StaleOwner`, `TokenLogGap`, `TierUnavailable`.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
import redis

from kvswap.tiers.shared import store_scripts as lua
from kvswap.tiers.shared.connection import as_bytes
from kvswap.tiers.shared.errors import StaleOwner, TokenLogGap, translating
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease


@dataclass(frozen=True)
class TokenAppend:
    applied: bool  # False: this turn id was applied already (a replayed turn)
    n_tokens: int  # the log's length afterwards


@dataclass
class TokenLogCounters:
    n_appends: int = 0
    n_duplicates: int = 0  # replayed turns, applied once
    n_stale: int = 0  # refused inside Redis: lease lost or fence moved
    n_gaps: int = 0


@dataclass(frozen=True)
class LogRead:
    """A mind's token log as read, with the id of the last turn applied to it ("" when none)
    and that turn's chat record (b"" when none)."""

    tokens: npt.NDArray[np.int32]
    turn_id: str
    chat: bytes


class TokenLog:
    """Fenced, idempotent appends to minds' token logs."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._append = client.register_script(lua.APPEND_TOKENS)
        self._lock = threading.Lock()
        self._counters = TokenLogCounters()

    def counters(self) -> dict[str, int]:
        with self._lock:
            return asdict(self._counters)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self._counters, name, getattr(self._counters, name) + 1)

    def append(
        self, lease: Lease, turn_id: str, n_base: int, tokens: npt.ArrayLike, chat: bytes = b""
    ) -> TokenAppend:
        """The log becomes its first `n_base` tokens followed by `tokens` (once per turn id),
        and the mind's chat record `chat` (b"": none)."""
        data = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
        keys = lease.keys
        with translating("token append"):
            reply = self._append(
                keys=[keys.lease, keys.fence, keys.tokens, keys.turns, keys.chat],
                args=[lease.holder.value, lease.fence, turn_id, n_base, data, chat],
            )
        outcome = int(reply[0])
        if outcome == lua.NOT_OWNER:
            self._count("n_stale")
            raise StaleOwner(f"lease on {keys.tag} lost before the token append")
        if outcome == lua.GAP:
            self._count("n_gaps")
            raise TokenLogGap(n_base, int(reply[1]))
        applied = outcome == lua.DONE
        self._count("n_appends" if applied else "n_duplicates")
        return TokenAppend(applied, int(reply[1]))

    def read(self, keys: MindKeys) -> npt.NDArray[np.int32]:
        """The mind's token log (empty when none)."""
        return self.read_log(keys).tokens

    def read_log(self, keys: MindKeys) -> LogRead:
        """The mind's token log, its last turn id and that turn's chat record, read at once."""
        with translating("token read"):
            pipe = self._client.pipeline(transaction=True)
            pipe.get(keys.tokens)
            pipe.lindex(keys.turns, 0)
            pipe.get(keys.chat)
            data, turn, chat = pipe.execute()
        tokens = np.frombuffer(as_bytes(data) or b"", dtype="<i4").astype(np.int32)
        turn_id = (as_bytes(turn) or b"").decode("utf-8", "replace")
        return LogRead(tokens, turn_id, as_bytes(chat) or b"")
