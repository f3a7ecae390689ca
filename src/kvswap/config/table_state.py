"""Flag table: the stored conversations of OpenAI's Responses API (kvswap-only flags).

Owns `--state-dir` (where their SQLite database lives; default under `--slot-save-path`, else
in memory), `--state-ttl-seconds` (how long a stored response is kept: 30 days, as OpenAI)
`--state-bytes` (their byte budget, default 1G; `0` for no bound, shared evenly by the keys
that store) and `--state-background-per-key` (the live background responses a key may have). docs/STATEFUL.md says
what is stored.
"""

from __future__ import annotations

import os

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag
from kvswap.config.sizes import parse_size
from kvswap.config.values import read_float, read_int

VALUE, STATE = Kind.VALUE, Group.STATE


def _set_state_dir(b: Builder, v: str) -> None:
    if os.path.exists(v) and not os.path.isdir(v):
        raise ValueError(f"not a directory: {v}")
    b.update("state", state_dir=v)


def _set_ttl(b: Builder, v: str) -> None:
    ttl_s = read_float(v)
    if not ttl_s > 0:
        raise ValueError(f"{v}: a stored response's time to live must be positive (seconds)")
    b.update("state", ttl_s=ttl_s)


def _set_background_per_key(b: Builder, v: str) -> None:
    n = read_int(v)
    if n < 1:
        raise ValueError(f"{v}: at least 1 background response per API key")
    b.update("state", background_per_key=n)


def _set_bytes(b: Builder, v: str) -> None:
    n_bytes = parse_size(v, "--state-bytes")
    b.update("state", budget_bytes=n_bytes if n_bytes > 0 else None)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--state-dir", VALUE, STATE, _set_state_dir, env="KVSWAP_ARG_STATE_DIR", hint="DIR",
         help="folder of the stored responses and conversations (an SQLite database, written "
         "before each answer; made if missing) (default: <--slot-save-path>/.kvswap-state, "
         "else in memory: lost at exit)"),
    flag("--state-ttl-seconds", VALUE, STATE, _set_ttl, env="KVSWAP_ARG_STATE_TTL_SECONDS",
         hint="SECONDS", help="how long a stored response is kept; a mind no stored response "
         "references any more is dropped (default: 2592000, 30 days, as OpenAI)"),
    flag("--state-bytes", VALUE, STATE, _set_bytes, env="KVSWAP_ARG_STATE_BYTES", hint="SIZE",
         help="byte budget of the stored records, shared evenly by the API keys that store: "
         "past it the least recently used chains of the key furthest over its share are "
         "dropped first, with their minds (default: 1G; 0 = no bound)"),
    flag("--state-background-per-key", VALUE, STATE, _set_background_per_key,
         env="KVSWAP_ARG_STATE_BACKGROUND_PER_KEY", hint="N",
         help="background responses (background: true) one API key may have queued or "
         "running at once; past it a 429 (default: 8)"),
)
# fmt: on
