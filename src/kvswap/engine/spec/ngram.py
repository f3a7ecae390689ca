"""`ngram-simple` drafting: propose the tokens that followed the last n-gram's previous occurrence.

Pure (no libllama): a function of a slot's own tokens, so a slot drafts without a draft model.
Same rule as the pinned llama-server's `common_ngram_simple_draft`: the pattern is the last
`size_n - 1` tokens of the history plus the token just sampled; the history is searched
backwards (never at position 0, never at the current end) for the newest earlier occurrence,
and the `size_m` tokens that followed it become the draft, when at least `size_n` follow.

    history  a b c d x y a b c | sampled d      size_n = 4
    pattern  b c d   (history[-3:] + sampled)   -> found at 1: draft = x y a b c ...
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def ngram_simple_draft(
    tokens: npt.NDArray[np.int32], sampled: int, size_n: int, size_m: int
) -> list[int]:
    """The draft for `sampled` following `tokens` (empty when the history has no match)."""
    n = len(tokens)
    if n <= size_n + size_m + 1:
        return []
    pattern = np.empty(size_n, dtype=np.int32)
    pattern[: size_n - 1] = tokens[n - size_n + 1 :]
    pattern[size_n - 1] = sampled
    # Candidate starts j in [1, n - size_n - 1], newest first: windows[j] = tokens[j:j+size_n].
    windows = np.lib.stride_tricks.sliding_window_view(tokens[: n - 1], size_n)
    hits = np.flatnonzero((windows[1 : n - size_n] == pattern).all(axis=1))
    if len(hits) == 0:
        return []
    match = int(hits[-1]) + 1
    n_copy = min(size_m, n - (match + size_n))
    if n_copy < size_n:
        return []
    start = match + size_n
    return [int(t) for t in tokens[start : start + n_copy]]
