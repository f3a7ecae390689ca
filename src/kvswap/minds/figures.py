"""What a turn's end writes and counts, in a cluster: the tokens the mind's KV holds, the turn's
id, and a takeover's costs.

- `kv_tokens`: the prompt and the generated tokens, cut to what the KV holds (the last sampled
  token is not in it): what the token log appends (`SharedTier.end_turn`, which publishes the
  page too when the turn leaves more than the RPO bound unpublished);
- `turn_id`: the request's own id (`TurnFacts.turn_id`) and a digest of those tokens, so a
  retried turn is applied to the token log once, and a regenerated one replaces the first;
- `takeover_figures`: for the first turn of a mind taken over here, what the takeover cost
  (lease wait, fetch, verify, restore, prefill) and how many tokens it prefilled that the mind
  had held before (what the publication missed: 0 with per-turn publication).

Pure (numpy); `shared.SharedMinds.turn_done` runs it and counts the figures.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvswap.core.types import Completion
from kvswap.core.vocab import ResumeSource
from kvswap.minds.placement import TurnFacts
from kvswap.tiers.shared.replica import Resumed

Tokens = npt.NDArray[np.int32]

_SOURCES = {
    ResumeSource.TIER: "the shared tier",
    ResumeSource.LOCAL: "its copy here",
    ResumeSource.NONE: "its prompt",
}


def kv_tokens(prompt: Tokens, completion: Completion) -> Tokens:
    """What the mind's KV holds after the turn: the prompt, then the generated tokens, cut to
    the completion's cached count."""
    tokens = np.concatenate([prompt, np.asarray(completion.tokens, dtype=np.int32)])
    return tokens[: completion.n_tokens_cached]


def turn_id(facts: TurnFacts | None, tokens: Tokens) -> str:
    """The turn's id in the token log: the request's (else "tokens"), with a digest of what
    the turn left in the KV, its completion included: a retry that answered the same applies
    once, a regenerated answer (the same request, another completion) is written over the
    first, so the log always says what the KV holds."""
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()[:24]
    return f"{facts.turn_id if facts is not None else 'tokens'}:{digest}"


@dataclass(frozen=True)
class TakeoverFigures:
    """A takeover's costs, counted once at the end of the mind's first turn here."""

    source: ResumeSource
    miss: str  # why the tier's page was not used ("" when it was)
    lease_wait_s: float
    fetch_s: float
    verify_s: float
    restore_s: float
    prefill_s: float
    n_prompt: int  # the turn's prefilled tokens
    n_reprefilled: int  # ... of them, those the mind had held before

    def counts(self) -> dict[str, float]:
        """The deltas of `stats.ResumeCounters` (`SharedTier.count`)."""
        from_tier = self.source is ResumeSource.TIER
        return {
            "n_resumes": 1,
            "n_resumes_tier": int(from_tier),
            "n_resumes_fallback": int(not from_tier),
            "lease_wait_s": self.lease_wait_s,
            "fetch_s": self.fetch_s,
            "verify_s": self.verify_s,
            "restore_s": self.restore_s,
            "prefill_s": self.prefill_s,
            "n_reprefilled_tokens": self.n_reprefilled,
        }

    def describe(self) -> str:
        """One log line's text: where the mind came from and what each part took."""
        after = f" after a miss ({self.miss})" if self.miss else ""
        return (
            f"resumed from {_SOURCES.get(self.source, self.source.value)}{after}: lease wait "
            f"{self.lease_wait_s * 1e3:.0f} ms, fetch {self.fetch_s * 1e3:.0f} ms (verify "
            f"{self.verify_s * 1e3:.0f}), restore {self.restore_s * 1e3:.1f} ms, prefill "
            f"{self.n_prompt} tokens in {self.prefill_s * 1e3:.0f} ms ({self.n_reprefilled} of "
            "them known before)"
        )


def takeover_figures(
    resumed: Resumed,
    prompt: Tokens,
    completion: Completion,
    this_turn: str,
    *,
    lease_wait_s: float,
    restore_ms: float,
) -> TakeoverFigures:
    """The figures of a turn that took its mind over (`resumed.taken_over`).

    What the mind held before this turn is its token log; for a retry of a turn its dead owner
    had logged already (the log ends with this very turn, `this_turn`), what the restored page
    held. The tokens of the prompt that match it, less those the turn found cached, were
    prefilled again (never the prompt's last token, which a turn always prefills)."""
    known = resumed.page_tokens if this_turn == resumed.last_turn else resumed.tokens_known
    n = min(len(known), len(prompt))
    differ = np.flatnonzero(known[:n] != prompt[:n])
    n_known = int(differ[0]) if len(differ) else n
    timings = completion.timings
    n_reprefilled = max(0, min(n_known, len(prompt) - 1) - timings.cache_n)
    return TakeoverFigures(
        source=resumed.source,
        miss=resumed.miss,
        lease_wait_s=lease_wait_s,
        fetch_s=resumed.fetch_s,
        verify_s=resumed.verify_s,
        restore_s=restore_ms / 1e3,
        prefill_s=timings.prompt_ms / 1e3,
        n_prompt=timings.prompt_n,
        n_reprefilled=n_reprefilled,
    )
