"""A slot: one sequence of the KV pool, the tokens cached in it, and the request it serves.

`Slot.tokens` always equals what the context holds for the slot's sequence: every change to the
KV (decode, cut, clear, state load) goes with the matching change here, done by the engine.
A slot with no request is idle; its cached tokens stay for prefix reuse until something
replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from kvswap.engine.running import RunningRequest

TokenArray = npt.NDArray[np.int32]


class TokenBuffer:
    """A growable int32 token list with vectorised prefix matching."""

    def __init__(self, capacity: int = 256) -> None:
        self._data = np.zeros(max(16, capacity), dtype=np.int32)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def view(self) -> TokenArray:
        """The tokens (a view: valid until the next change)."""
        return self._data[: self.n]

    def append(self, tokens: TokenArray | list[int]) -> None:
        arr = np.asarray(tokens, dtype=np.int32)
        end = self.n + len(arr)
        if end > len(self._data):
            grown = np.zeros(max(end, 2 * len(self._data)), dtype=np.int32)
            grown[: self.n] = self._data[: self.n]
            self._data = grown
        self._data[self.n : end] = arr
        self.n = end

    def truncate(self, n: int) -> None:
        assert 0 <= n <= self.n
        self.n = n

    def replace(self, tokens: TokenArray) -> None:
        self.n = 0
        self.append(tokens)

    def common_prefix(self, other: TokenArray) -> int:
        """Length of the longest common prefix with `other`."""
        n = min(self.n, len(other))
        if n == 0:
            return 0
        diff = np.flatnonzero(self._data[:n] != other[:n])
        return int(diff[0]) if len(diff) else n


@dataclass
class Slot:
    """One slot of the server (its sequence id equals its slot id)."""

    id: int
    n_ctx: int  # the slot's window (n_ctx_slot)
    tokens: TokenBuffer = field(default_factory=TokenBuffer)
    running: RunningRequest | None = None
    t_last_used: float = 0.0
    locked: bool = False  # a capture waits for its buffer: nothing else may touch the slot
    # The LoRA set its KV was computed under (engine.lora.LoraSet); only equal sets share it.
    lora: tuple[tuple[int, float], ...] = ()
    mind: str | None = None  # the mind (engine.minds key) whose state the slot holds

    @property
    def seq_id(self) -> int:
        return self.id

    @property
    def is_idle(self) -> bool:
        return self.running is None and not self.locked
