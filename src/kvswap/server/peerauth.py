"""Replica-to-replica requests of a cluster, authenticated: a forwarded turn's hop mark and a
hand-off request carry `X-Kvswap-Peer: <replica id> <unix seconds> <HMAC-SHA256>`, signed with a
key every replica derives from the shared tier's password (the one secret they already share;
`peer_key`), over the replica id, the time, the method and the path. A replica honours the hop
mark (`X-Kvswap-Hop`: never forward this turn again) and answers `POST /cluster/handoff` only
for a valid signature less than `MAX_SKEW_S` old, so a client can neither make a replica give
its minds up (each hand-off publishes the whole mind to Redis) nor mark its own turns as
forwarded. A tier URL without a password (a Redis open to anyone who reaches it) gives no key:
replicas then sign nothing and check nothing.

Pure (hashlib, hmac); the forwarder (`forward.Forwarder`) signs and checks.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Final
from urllib.parse import parse_qs, urlsplit

PEER_HEADER: Final = "x-kvswap-peer"
MAX_SKEW_S: Final = 60.0


def peer_key(shared_tier_url: str | None) -> bytes | None:
    """The signing key of a cluster whose tier is `shared_tier_url` (None: no password)."""
    if not shared_tier_url:
        return None
    parts = urlsplit(shared_tier_url)
    try:
        password = parts.password
    except ValueError:
        password = None
    if not password:
        password = next(iter(parse_qs(parts.query).get("password", [])), None)
    if not password:
        return None
    return hashlib.sha256(b"kvswap-peer\0" + password.encode("utf-8")).digest()


def _mac(key: bytes, replica_id: str, t_s: int, method: str, path: str) -> str:
    message = f"{replica_id} {t_s} {method.upper()} {path}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign(
    key: bytes, replica_id: str, method: str, path: str, clock: Callable[[], float] = time.time
) -> str:
    """The `X-Kvswap-Peer` value of a request this replica sends to another."""
    t_s = int(clock())
    return f"{replica_id} {t_s} {_mac(key, replica_id, t_s, method, path)}"


def verify(
    key: bytes, value: str, method: str, path: str, clock: Callable[[], float] = time.time
) -> str | None:
    """The replica id a valid `X-Kvswap-Peer` value names, else None (malformed, stale, or
    signed with another key or for another request)."""
    parts = value.split(" ")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    replica_id, t_s, mac = parts[0], int(parts[1]), parts[2]
    if abs(clock() - t_s) > MAX_SKEW_S:
        return None
    if not hmac.compare_digest(mac, _mac(key, replica_id, t_s, method, path)):
        return None
    return replica_id
