"""A slot's token list: a growable int32 array with vectorised prefix matching.

A leaf value type (no libllama, no engine state), shared by slots, drafts and pages.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

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
