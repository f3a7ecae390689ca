"""A slot: one sequence of the KV pool, the tokens cached in it, and the request it serves.

`Slot.tokens` always equals what the context holds for the slot's sequence: every change to the
KV (decode, cut, clear, state load) goes with the matching change here, done by the engine.
A slot with no request is idle; its cached tokens stay for prefix reuse until something
replaces them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey
from kvswap.core.types import GenerationRequest, LoraSet
from kvswap.engine.tokens import TokenBuffer

if TYPE_CHECKING:
    from kvswap.engine.running import RunningRequest


@dataclass
class Slot:
    """One slot of the server (its sequence id equals its slot id)."""

    id: int
    n_ctx: int  # the slot's window (n_ctx_slot)
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    running: RunningRequest | None = None
    t_last_used: float = 0.0
    locked: bool = False  # a capture waits for its buffer: nothing else may touch the slot
    # The LoRA set its KV was computed under (core.types.LoraSet); only equal sets share it.
    lora: LoraSet = ()
    mind: PageKey | None = None  # the mind whose state the slot holds
    # The tenant whose anonymous request (or slot verb) left the tokens: only its own requests
    # reuse them (`prefix_for`).
    namespace: str = PUBLIC_NAMESPACE

    @property
    def seq_id(self) -> int:
        return self.id

    @property
    def is_idle(self) -> bool:
        return self.running is None and not self.locked

    def reusable(self, prompt: npt.NDArray[np.int32], req: GenerationRequest) -> int:
        """How many leading tokens of `req`'s prompt the slot's KV may serve: its mind's (the
        slot holds that mind: seated first) or its own tenant's prompt, computed under the
        request's LoRA set; none without `cache_prompt`."""
        if not req.cache_prompt or self.lora != req.lora:
            return 0
        if req.mind is not None:
            return self.tokens.common_prefix(prompt)
        return self.prefix_for(prompt, req.namespace)

    def prefix_for(self, prompt: npt.NDArray[np.int32], namespace: str) -> int:
        """How many leading tokens of an anonymous prompt of tenant `namespace` the slot holds
        already: none of another tenant's (no request learns what another key sent)."""
        if self.mind is not None or self.namespace != namespace:
            return 0
        return self.tokens.common_prefix(prompt)


class SlotTable(Sequence[Slot]):
    """The engine's slots, in slot id order: the one list every manager reads, rebuilt (never
    reassigned) when a reconfigure changes the slot count."""

    def __init__(self, n_parallel: int, n_ctx_slot: int) -> None:
        self._slots: list[Slot] = []
        self.rebuild(n_parallel, n_ctx_slot)

    def rebuild(self, n_parallel: int, n_ctx_slot: int) -> None:
        """Empty slots for a new geometry (their contents were moved out first)."""
        self._slots[:] = [Slot(i, n_ctx_slot) for i in range(n_parallel)]

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, slot_id: int) -> Slot:  # type: ignore[override]
        return self._slots[slot_id]

    def __iter__(self) -> Iterator[Slot]:
        return iter(self._slots)

    def valid(self, slot_id: int) -> bool:
        return 0 <= slot_id < len(self._slots)

    def busy(self) -> list[Slot]:
        """Slots running a request."""
        return [s for s in self._slots if s.running is not None]

    def holding(self, mind: PageKey) -> Slot | None:
        """The slot whose state is mind `mind`'s, if any."""
        return next((s for s in self._slots if s.mind == mind), None)

    def idle_residents(self) -> list[Slot]:
        """Idle slots that hold tokens, least recently used first."""
        idle = [s for s in self._slots if s.is_idle and len(s.tokens) > 0]
        return sorted(idle, key=lambda s: s.t_last_used)

    def idle_minds(self, keys: frozenset[PageKey] | None = None) -> list[Slot]:
        """The idle slots holding a mind with tokens (only those of `keys`, when given): what a
        spill before exit or a scheduled flush copies out."""
        return [
            s
            for s in self._slots
            if s.mind is not None
            and s.is_idle
            and len(s.tokens) > 0
            and (keys is None or s.mind in keys)
        ]

    def tokens_of(self, key: PageKey) -> npt.NDArray[np.int32] | None:
        """A copy of the tokens of mind `key` when a slot holds it."""
        slot = next((s for s in self._slots if s.mind == key), None)
        return slot.tokens.view().copy() if slot is not None else None
