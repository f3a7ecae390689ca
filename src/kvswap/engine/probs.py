"""Token probabilities for `n_probs` / `logprobs`: softmax of one logits row, top N.

Pure numpy on a copy of the logits; called by the engine only for requests that ask for probs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kvswap.core.types import TokenProb, TokenProbs


def top_probs(
    logits: npt.NDArray[np.float32], token: int, n: int, piece: Callable[[int], bytes]
) -> TokenProbs:
    """The sampled token's probability and the `n` most likely tokens, most likely first."""
    z = logits.astype(np.float64)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    n = min(n, len(p))
    top = np.argpartition(-p, n - 1)[:n]
    top = top[np.argsort(-p[top], kind="stable")]
    return TokenProbs(
        token=token,
        piece=piece(token),
        prob=float(p[token]),
        top=tuple(TokenProb(int(t), piece(int(t)), float(p[t])) for t in top),
    )
