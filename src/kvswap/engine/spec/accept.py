"""Pure: judging a draft against the tokens the target sampled for it.

A verification batch holds the slot's pending token `p` and its draft `d0 .. dn-1`; the target
samples row by row, and goes on only while it agrees with the draft:

    batch rows   p   d0  d1  d2         target samples  d0  d1  x  -> 2 accepted
    kept KV      p   d0  d1             pending x (next step's first token)

`more(draft, sampled, finished)` says whether the next row must be sampled; `judge(draft,
sampled)` gives the counts once sampling stopped. No libllama, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What a verification kept."""

    n_accepted: int  # draft tokens whose KV is kept (each was followed by another sampled row)
    n_matched: int  # draft tokens the target agreed with (llama-server's count, the last included)


def more(draft: Sequence[int], sampled: Sequence[int], finished: bool) -> bool:
    """Whether the target samples the next row: the request goes on and agreed so far."""
    i = len(sampled) - 1
    return not finished and i < len(draft) and sampled[i] == draft[i]


def judge(draft: Sequence[int], sampled: Sequence[int]) -> Verdict:
    """The counts of a verification whose sampled rows are `sampled` (at least one)."""
    assert sampled, "a verification samples at least the pending token's row"
    n_matched = sum(1 for i, t in enumerate(sampled) if i < len(draft) and t == draft[i])
    return Verdict(n_accepted=len(sampled) - 1, n_matched=n_matched)
