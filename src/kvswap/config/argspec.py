"""The shape of one flag-table entry and the mutable state the setters fill.

Owns `Flag` (names, environment variable, kind, setter, help), `Builder` (the settings being
assembled during one parse) and the small setter factories the tables use. Used only by the
`table_*` modules and `flags.py`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from kvswap.config.settings import (
    ClusterSettings,
    ContextSettings,
    HttpSettings,
    LogSettings,
    ModelSettings,
    PagingSettings,
    SamplingDefaults,
    SpecSettings,
    StateSettings,
)
from kvswap.config.sizes import parse_size
from kvswap.config.values import INT32_MAX, INT32_MIN, read_float, read_int


class Kind(enum.Enum):
    """How many command-line words a flag takes."""

    VOID = "void"  # no value; its env var applies it when truthy
    TOGGLE = "toggle"  # no value; `names` set true, `neg` set false; env var is a boolean
    VALUE = "value"  # one value
    PAIR = "pair"  # two values (only --control-vector-layer-range)


class Group(enum.Enum):
    """The help section a flag is listed in, in the help's order: kvswap's own sections first."""

    PAGES = "minds: the RAM page store, the disk tier and checkpoints (kvswap)"
    CLUSTER = "cluster: replicas that share minds through Redis (kvswap)"
    STATE = "stored conversations: OpenAI's Responses state on minds (kvswap)"
    LIMITS = "request limits (kvswap)"
    MINDS = "llama-server's flags that matter to minds"
    INFO = "print and exit"
    COMMON = "common params"
    SAMPLING = "sampling params"
    SPEC = "speculative params"
    SERVER = "server params"
    REMOVED = "removed params (fail, naming the replacement)"
    IGNORED = "accepted for llama-server compatibility, ignored by kvswap"

    @property
    def kvswap_only(self) -> bool:
        """A section of flags llama-server does not have (their variables are KVSWAP_ARG_*)."""
        return self in (Group.PAGES, Group.CLUSTER, Group.STATE, Group.LIMITS)


@dataclass
class Builder:
    """Settings under construction; setters replace fields of the frozen sections."""

    model: ModelSettings
    context: ContextSettings
    sampling: SamplingDefaults
    http: HttpSettings
    paging: PagingSettings
    spec: SpecSettings
    log: LogSettings
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    state: StateSettings = field(default_factory=StateSettings)
    # Raw thread flags by primary name (-t, -tb, -td, -tbd), resolved in flags.py.
    threads: dict[str, int] = field(default_factory=dict)
    # (speculative type, the flag or env var that asked for it), in order.
    spec_types: list[tuple[str, str]] = field(default_factory=list)
    # --dry-sequence-breaker clears the defaults once, then appends.
    dry_breakers_cleared: bool = False
    # -e/--escape, --no-escape: process backslash escapes in DRY sequence breakers.
    escape: bool = True
    # Primary names of the flags given (on the command line or through their env var).
    given: set[str] = field(default_factory=set)
    # Where the value being applied comes from, for messages: 'argument "-c"' or
    # 'environment variable "LLAMA_ARG_CTX_SIZE"'.
    source: str = ""

    def update(self, section: str, **changes: object) -> None:
        """Replace fields of one section (`"context"`, `"http"`, ...)."""
        setattr(self, section, dataclasses.replace(getattr(self, section), **changes))


# A setter receives the builder and the value: the word after the flag for VALUE, "1" for
# VOID, "1"/"0" for TOGGLE (positive/negative name).
Setter = Callable[[Builder, str], None]


@dataclass(frozen=True)
class Flag:
    """One llama-server flag (or kvswap-only flag) and what kvswap does with it."""

    names: tuple[str, ...]  # every spelling; names[0] is the primary name
    kind: Kind
    group: Group
    apply: Setter | None = None  # None: accepted and ignored (or removed)
    env: str | None = None  # llama-server's environment variable (or KVSWAP_ARG_*)
    neg: tuple[str, ...] = ()  # TOGGLE: the names that set it false
    hint: str = ""  # the value's placeholder in the help
    help: str = ""
    removed: str | None = None  # the replacement named when the flag is used

    @property
    def primary(self) -> str:
        return self.names[0]


def flag(
    names: str,
    kind: Kind,
    group: Group,
    apply: Setter | None = None,
    *,
    env: str | None = None,
    neg: str = "",
    hint: str = "",
    help: str = "",
    removed: str | None = None,
) -> Flag:
    """A table entry; `names` and `neg` are space-separated spellings."""
    return Flag(
        tuple(names.split()), kind, group, apply, env, tuple(neg.split()), hint, help, removed
    )


def set_int(section: str, name: str, lo: int = INT32_MIN, hi: int = INT32_MAX) -> Setter:
    return lambda b, v: b.update(section, **{name: read_int(v, lo, hi)})


def set_float(section: str, name: str) -> Setter:
    return lambda b, v: b.update(section, **{name: read_float(v)})


def set_str(section: str, name: str) -> Setter:
    return lambda b, v: b.update(section, **{name: v})


def set_bool(section: str, name: str) -> Setter:
    """For VOID (always "1") and TOGGLE ("1" or "0") flags."""
    return lambda b, v: b.update(section, **{name: v == "1"})


def set_size(section: str, name: str, flag_name: str) -> Setter:
    return lambda b, v: b.update(section, **{name: parse_size(v, flag_name)})
