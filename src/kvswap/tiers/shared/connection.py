"""Connecting to the shared tier: one redis-py client per process, shared by every thread.

URLs (redis-py's own syntax, `redis.Redis.from_url`):
- `redis://host:port/db`, `redis://:PASSWORD@host:port/db` (Redis AUTH, `requirepass`),
  `redis://USER:PASSWORD@host:port/db` (an ACL user), or the password as `?password=...`;
- `rediss://...`: the same over TLS. The server's certificate is checked against the system's
  CAs, or `?ssl_ca_certs=/path/ca.pem`; a client certificate (Redis `tls-auth-clients`) is
  `&ssl_certfile=/path/client.pem&ssl_keyfile=/path/client.key`;
- `unix:///path/redis.sock?db=0` (with `password=` for AUTH).

A URL's password never appears in a log line, an error or /props: `redacted` replaces it (in
the user part and in the query) with `***`, and every message here goes through it.

Bytes in, bytes out (`decode_responses=False`: chunks are binary). Failures surface fast, as
`TierUnavailable` from the callers: two retries at most, 50 ms apart and growing, instead of
redis-py's default back-off (seconds per call when Redis is down, which would stall a turn's
end or a drain). The socket timeout bounds one command: a replica keeps two clients, one for
the small commands (leases, token appends, manifests: `SMALL_COMMAND_TIMEOUT_S`, so a Redis
that stops answering, a partition, holds a turn's end for seconds, not half a minute) and one
for chunks (`COMMAND_TIMEOUT_S`, an 8 MiB chunk included).
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

CONNECT_TIMEOUT_S: Final = 2.0
COMMAND_TIMEOUT_S: Final = 10.0  # the bulk client's: an 8 MiB chunk on a slow link
SMALL_COMMAND_TIMEOUT_S: Final = 2.0  # leases, token appends, manifests: bytes to kilobytes
SCHEMES: Final = ("redis", "rediss", "unix")
_QUERY_PASSWORD_RE = re.compile(r"(^|&)(password=)[^&]*", re.IGNORECASE)


class TierURLError(ValueError):
    """A shared tier URL redis-py cannot use (the message shows it with its password hidden)."""


def redacted(url: str) -> str:
    """`url` with its password hidden (`redis://:***@host:6379/0`, `...?password=***`); every
    other character is kept as written. Safe on malformed URLs (nothing is parsed but the
    authority's `user:password@` and the query's `password=`)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:***@{hostport}"
    path, qmark, query = tail.partition("?")
    if qmark:
        tail = f"{path}?" + _QUERY_PASSWORD_RE.sub(r"\1\2***", query)
    return f"{scheme}{sep}{authority}{tail}"


def connect(url: str, *, command_timeout_s: float = COMMAND_TIMEOUT_S) -> redis.Redis:
    """A client for a shared tier URL (see the module docstring); `TierURLError` names what is
    wrong without the password. Nothing is sent until the first command."""
    if urlsplit(url).scheme not in SCHEMES:
        raise TierURLError(
            f"shared tier URL {redacted(url)!r}: expected redis://[[user]:password@]host:port/db, "
            "rediss://... (TLS) or unix:///path"
        )
    try:
        return redis.Redis.from_url(
            url,
            decode_responses=False,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=command_timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=2),
            retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
        )
    except (ValueError, TypeError) as err:  # redis-py's messages name the field, not the URL
        raise TierURLError(f"shared tier URL {redacted(url)!r}: {err}") from err


def as_bytes(reply: object) -> bytes | None:
    """A reply of a `connect()` client (bytes, not str) as bytes, None staying None."""
    if reply is None:
        return None
    if not isinstance(reply, bytes):
        raise TypeError(f"expected bytes from Redis, got {type(reply).__name__}")
    return reply
