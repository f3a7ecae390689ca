"""LoRA sets: what a slot's KV was computed under, which set a step runs, and how a page names it.

A `LoraSet` is the canonical form of "which adapters at which scales": (adapter id, scale)
pairs sorted by id, zero scales dropped (libllama ignores them, so they change nothing). Two
requests share KV, and a batch, only when their sets are equal. Inside the process adapters are
named by id (load order); pages and slot files name them by content (`core.page.LoraRef`: SHA-256
and path), and `resolve` maps those back onto whatever ids the running server gave the same
files.

`SetTurns` picks the set each step runs: libllama applies adapters per context, so a step
batches only slots of one set. Sets take turns in sorted order, so none starves; a turn lasts
up to `STEPS_PER_TURN` steps while its set has work, because every change of the context's set
makes libllama re-plan its compute graph (measured ~18 ms on SmolLM2-135M, 1 thread, about half
a decode step): switching every step would cost that on every token.

Pure: no libllama, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.page import LoraRef
from kvswap.core.types import LoraSet

STEPS_PER_TURN = 8


def lora_set(entries: Iterable[tuple[int, float]]) -> LoraSet:
    """The canonical set of (id, scale) pairs (a later entry for an id wins)."""
    scales = dict(entries)
    return tuple((i, float(scales[i])) for i in sorted(scales) if scales[i] != 0.0)


def refs_of(lora: LoraSet, adapters: Sequence[AdapterInfo]) -> tuple[LoraRef, ...]:
    """How a page or slot file records `lora`: each adapter by hash and path."""
    return tuple(LoraRef(adapters[i].sha256, adapters[i].path, scale) for i, scale in lora)


def resolve(refs: Sequence[LoraRef], adapters: Sequence[AdapterInfo], what: str) -> LoraSet:
    """The set `refs` name, in this server's ids; a typed 400 when an adapter is not loaded."""
    by_hash: dict[str, int] = {}
    for info in reversed(adapters):  # the same file loaded twice: the first id wins
        by_hash[info.sha256] = info.id
    missing = [r for r in refs if r.sha256 not in by_hash]
    if missing:
        names = ", ".join(f"{r.path} (sha256 {r.sha256[:12]})" for r in missing)
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"cannot load {what}: it was computed under LoRA adapter(s) this server has not "
            f"loaded: {names}; start the server with them (--lora)",
        )
    return lora_set((by_hash[r.sha256], r.scale) for r in refs)


class SetTurns:
    """The set each step runs: the current one for up to `steps_per_turn` steps while it has
    work, then the next one in sorted order."""

    def __init__(self, steps_per_turn: int = STEPS_PER_TURN) -> None:
        self.steps_per_turn = steps_per_turn
        self.current: LoraSet | None = None
        self.n_steps = 0  # steps the current set has run in its turn

    def pick(self, groups: Iterable[LoraSet]) -> LoraSet:
        """The set of the next step, among the sets of the busy slots (at least one)."""
        waiting = set(groups)
        if self.current in waiting and (self.n_steps < self.steps_per_turn or len(waiting) == 1):
            self.n_steps += 1
            return self.current
        self.current = next_group(waiting, self.current)
        self.n_steps = 1
        return self.current


def next_group(groups: Iterable[LoraSet], last: LoraSet | None) -> LoraSet:
    """The set the next step runs: the first one after `last` in sorted order, wrapping."""
    ordered = sorted(set(groups))
    assert ordered, "no group to run"
    if last is None:
        return ordered[0]
    for group in ordered:
        if group > last:
            return group
    return ordered[0]
