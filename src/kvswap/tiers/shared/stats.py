"""What resuming minds here cost, for /metrics and /pages: the takeovers and their time split.

A takeover (a mind resumed on this replica from another's publication, or from nothing) is
counted once, at the end of its first turn, with its parts: waiting out a dead owner's lease,
fetching the page (wall clock) and checking its chunks (CRC-32, summed over threads), the
engine applying it to a slot, and the turn's prefill; and the tokens it prefilled that the
mind had held before (what the publication missed: 0 with per-turn publication). Forwarded
turns, hand-offs and refusals are counted by the server beside these. Pure; thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class ResumeCounters:
    n_resumes: int = 0  # takeovers that ended their first turn here
    n_resumes_tier: int = 0  # ... from the tier's page
    n_resumes_fallback: int = 0  # ... from local copies or a re-prefill after a miss
    lease_wait_s: float = 0.0
    fetch_s: float = 0.0
    verify_s: float = 0.0
    restore_s: float = 0.0
    prefill_s: float = 0.0  # the resumed turns' prefill (their new tokens, and lost ones)
    n_reprefilled_tokens: int = 0  # tokens the mind held before, prefilled again here
    n_forwarded: int = 0  # turns sent on to the mind's owner
    n_forward_failed: int = 0  # ... whose owner could not be reached (then taken over here)
    n_handoffs_asked: int = 0  # hand-offs asked of an owner after a forwarded turn
    n_unavailable: int = 0  # turns answered 503 (owner unreachable past the wait, tier away)


class ResumeStats:
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = ResumeCounters()

    def count(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self._c, name, getattr(self._c, name) + delta)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return asdict(self._c)
