"""Flag table: a replica of a kvswap cluster and its shared Redis tier (kvswap-only flags).

Owns the entries and setters of `--shared-tier`, `--replica-id`, `--advertise-url`,
`--shared-tier-bytes`, the write-behind bound (`--shared-tier-rpo-tokens`,
`--shared-tier-rpo-seconds`) and `--shared-tier-lease-ms`, and `check`, run once parsing is done:
the flags that only mean something with a shared tier need `--shared-tier`, and a shared tier
needs a replica id, an advertised URL and the page store. Defaults: docs/CLUSTER.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag
from kvswap.config.errors import ConfigError
from kvswap.config.sizes import parse_size
from kvswap.config.values import read_float, read_int

VALUE, KVSWAP = Kind.VALUE, Group.CLUSTER
_REPLICA_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
# Flags that configure the shared tier: each needs --shared-tier (primary names).
_NEEDS_TIER = (
    "--replica-id",
    "--advertise-url",
    "--shared-tier-peers",
    "--shared-tier-bytes",
    "--shared-tier-rpo-tokens",
    "--shared-tier-rpo-seconds",
    "--shared-tier-lease-ms",
    "--shared-tier-quiet-seconds",
    "--shared-tier-release-seconds",
    "--shared-tier-drain-seconds",
)


def _set_shared_tier(b: Builder, v: str) -> None:
    # the value is never echoed: it may hold a password (audit B7)
    scheme = urlsplit(v).scheme
    if scheme not in _REDIS_SCHEMES or any(c.isspace() for c in v):
        got = f"scheme {scheme!r}" if scheme else "no scheme"
        raise ValueError(
            f"expected redis://[[user]:password@]host:port/db, rediss://... (TLS) or "
            f"unix:///path, with no spaces (got {got}; the URL is not shown: it may hold a "
            "password)"
        )
    b.update("cluster", shared_tier=v)


def _set_replica_id(b: Builder, v: str) -> None:
    if not _REPLICA_ID_RE.fullmatch(v):
        raise ValueError(f"{v!r}: 1-64 of A-Z a-z 0-9 _ . -")
    b.update("cluster", replica_id=v)


def _set_advertise_url(b: Builder, v: str) -> None:
    b.update("cluster", advertise_url=_replica_url(v))


def _set_peers(b: Builder, v: str) -> None:
    urls = tuple(_replica_url(u.strip()) for u in v.split(",") if u.strip())
    if not urls:
        raise ValueError("expected http://host:port[,http://host:port...]")
    b.update("cluster", peers=urls)


def _replica_url(v: str) -> str:
    """A replica's URL as other replicas reach it, checked (a ValueError names what is
    wrong)."""
    parts = urlsplit(v)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ValueError(f"{v!r}: expected http://host:port (where other replicas reach this one)")
    if any(c.isspace() for c in v) or parts.path.strip("/") or parts.query:
        raise ValueError(f"{v!r}: expected http://host:port, with no path")
    return v.rstrip("/")


def _set_bytes(b: Builder, v: str) -> None:
    n_bytes = parse_size(v, "--shared-tier-bytes")
    if n_bytes < 1:
        raise ValueError("must be at least 1 byte")
    b.update("cluster", shared_tier_bytes=n_bytes)


def _set_rpo_tokens(b: Builder, v: str) -> None:
    b.update("cluster", rpo_tokens=read_int(v, lo=0))


def _set_lease_ms(b: Builder, v: str) -> None:
    b.update("cluster", lease_ms=read_int(v, lo=100, hi=600_000))


def _seconds(field_name: str) -> Callable[[Builder, str], None]:
    def setter(b: Builder, v: str) -> None:
        seconds = read_float(v)
        if not seconds > 0:
            raise ValueError("must be more than 0 seconds")
        b.update("cluster", **{field_name: seconds})

    return setter


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--shared-tier", VALUE, KVSWAP, _set_shared_tier, env="KVSWAP_ARG_SHARED_TIER",
         hint="URL", help="join a kvswap cluster: minds are published to, owned through and "
         "resumed from this Redis (redis://[[user]:password@]host:port/db, rediss:// for TLS; "
         "pass a password through the environment variable, not argv); needs --replica-id and "
         "--advertise-url (default: none)"),
    flag("--replica-id", VALUE, KVSWAP, _set_replica_id, env="KVSWAP_ARG_REPLICA_ID",
         hint="ID", help="this replica's name in the cluster (its HAProxy server name)"),
    flag("--advertise-url", VALUE, KVSWAP, _set_advertise_url, env="KVSWAP_ARG_ADVERTISE_URL",
         hint="URL", help="where the other replicas reach this one (http://host:port): turns "
         "for the minds it owns are forwarded there"),
    flag("--shared-tier-peers", VALUE, KVSWAP, _set_peers, env="KVSWAP_ARG_SHARED_TIER_PEERS",
         hint="URL,...", help="the advertised URL of every replica of the cluster, this one's "
         "included: the only places a turn is forwarded to (a lease naming any other URL is "
         "refused with a 503)"),
    flag("--shared-tier-bytes", VALUE, KVSWAP, _set_bytes, env="KVSWAP_ARG_SHARED_TIER_BYTES",
         hint="SIZE", help="byte budget of the shared tier: past it the least recently used "
         "minds keep their tokens only (default: no budget)"),
    flag("--shared-tier-rpo-tokens", VALUE, KVSWAP, _set_rpo_tokens,
         env="KVSWAP_ARG_SHARED_TIER_RPO_TOKENS", hint="N",
         help="a turn leaving more than N unpublished tokens publishes its mind's page before "
         "answering, so a replica's death re-prefills at most N tokens per mind (default: 2048; "
         "0 = every turn)"),
    flag("--shared-tier-rpo-seconds", VALUE, KVSWAP, _seconds("rpo_seconds"),
         env="KVSWAP_ARG_SHARED_TIER_RPO_SECONDS", hint="SECONDS",
         help="a mind's unpublished page is published in the background once this old "
         "(default: 30)"),
    flag("--shared-tier-lease-ms", VALUE, KVSWAP, _set_lease_ms,
         env="KVSWAP_ARG_SHARED_TIER_LEASE_MS", hint="MS",
         help="a mind's owner lease, renewed while held: a dead replica's minds move after at "
         "most this long (default: 5000)"),
    flag("--shared-tier-quiet-seconds", VALUE, KVSWAP, _seconds("quiet_seconds"),
         env="KVSWAP_ARG_SHARED_TIER_QUIET_SECONDS", hint="SECONDS",
         help="a mind idle this long after its turn is published, so a replica's death loses "
         "only the minds it was answering (default: 2)"),
    flag("--shared-tier-release-seconds", VALUE, KVSWAP, _seconds("release_seconds"),
         env="KVSWAP_ARG_SHARED_TIER_RELEASE_SECONDS", hint="SECONDS",
         help="a published mind idle this long has its lease released (its copies here stay; "
         "default: 60)"),
    flag("--shared-tier-drain-seconds", VALUE, KVSWAP, _seconds("drain_seconds"),
         env="KVSWAP_ARG_SHARED_TIER_DRAIN_SECONDS", hint="SECONDS",
         help="the most SIGTERM spends publishing minds to the tier, after spilling them to "
         "disk: keep it under the grace period (default: 60)"),
)
# fmt: on


def check(b: Builder) -> None:
    """The cross-flag rules, once every flag and environment variable is read."""
    c = b.cluster
    if c.shared_tier is None:
        for name in _NEEDS_TIER:
            if name in b.given:
                raise ConfigError(f"{name} needs --shared-tier (the cluster's Redis)")
        return
    if c.replica_id is None:
        raise ConfigError("--shared-tier needs --replica-id (this replica's name in the cluster)")
    if c.advertise_url is None:
        raise ConfigError(
            "--shared-tier needs --advertise-url (where the other replicas reach this one, "
            "http://host:port)"
        )
    if not c.peers:
        raise ConfigError(
            "--shared-tier needs --shared-tier-peers (every replica's advertised URL, this "
            "one's included: the only places a turn is forwarded to)"
        )
    if c.advertise_url not in c.peers:
        raise ConfigError(
            f"--shared-tier-peers does not list this replica's --advertise-url {c.advertise_url}"
        )
    if b.paging.page_ram_bytes <= 0:
        raise ConfigError("--shared-tier needs the page store: --page-ram-bytes must be above 0")
