"""Context checkpoints: where to take them, and the byte budget they live under (docs/DESIGN.md, "Checkpoints, drafts and adapters").

Memory that cannot be cut at an arbitrary position (recurrent state, hybrids, a sliding window
without `--swa-full`) gets partial snapshots (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`) during
prefill. A snapshot taken when the slot holds `n_tokens` tokens puts the slot back there: a
prompt that diverges later restores the newest one at or before the divergence instead of
prefilling from zero.

Pure (no libllama): `boundaries` says where a prompt's checkpoints go, `CheckpointBudget`
decides which checkpoints make room under the byte budget. The engine does the copies.

Where, for a prompt of L tokens (positions are token counts: "after n tokens"):
- near the prompt end, as llama-server: L - (n_ubatch + 4) and L - 4;
- beyond llama-server, every `--checkpoint-min-step` tokens: S, 2S, 3S, ... (0 = off).
Caps, independent: `--ctx-checkpoints N` per slot (the oldest goes first), and
`--ctx-checkpoints-bytes B` across all slots: the slot holding the most checkpoint bytes drops
its oldest checkpoint after its first; when no slot has more than one, the new one is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kvswap.checkpoints")


@dataclass
class Checkpoint:
    """A partial state of a slot after its first `n_tokens` tokens."""

    n_tokens: int
    pos_min: int  # the memory's lowest position then (a sliding window's start)
    pos_max: int  # its highest position then (n_tokens - 1)
    data: Any  # a buffer holding the partial state, libllama's 8-byte prefix included
    n_bytes: int


def boundaries(n_prompt: int, n_done: int, n_ubatch: int, min_step: int) -> list[int]:
    """Token counts in (n_done, n_prompt) at which this prompt's checkpoints are taken."""
    wanted = {n_prompt - (n_ubatch + 4), n_prompt - 4}
    if min_step > 0:
        wanted.update(range(min_step, n_prompt, min_step))
    return sorted(b for b in wanted if n_done < b < n_prompt)


def newest_usable(checkpoints: Sequence[Checkpoint], n_keep: int) -> Checkpoint | None:
    """The newest checkpoint at or before `n_keep` tokens."""
    usable = [c for c in checkpoints if c.n_tokens <= n_keep]
    return max(usable, key=lambda c: c.n_tokens) if usable else None


@dataclass
class BudgetCounters:
    evicted_budget_total: int = 0
    skipped_budget_total: int = 0
    evicted_count_total: int = 0  # dropped by the per-slot count cap


@dataclass
class Admission:
    """What admitting one new checkpoint costs: the evictions, or a skip."""

    skip: bool
    evict_oldest: list[int] = field(default_factory=list)  # slot ids (per-slot count cap)
    evict_budget: list[int] = field(default_factory=list)  # slot ids (byte budget), in order


class CheckpointBudget:
    """The two caps over every slot's checkpoints; see the module docstring."""

    def __init__(self, max_per_slot: int, max_bytes: int) -> None:
        self.max_per_slot = max_per_slot
        self.max_bytes = max_bytes  # 0: no byte budget
        self.counters = BudgetCounters()

    @staticmethod
    def total_bytes(slots: Mapping[int, Sequence[Checkpoint]]) -> int:
        return sum(c.n_bytes for cps in slots.values() for c in cps)

    def plan(
        self,
        slots: Mapping[int, Sequence[Checkpoint]],
        slot_id: int,
        n_bytes: int,
        frozen: Collection[int] = (),
    ) -> Admission:
        """Decide how `slot_id` takes a new checkpoint of `n_bytes` (nothing is changed).
        Slots in `frozen` (a capture is copying their checkpoints) give none up."""
        if self.max_per_slot <= 0:
            return Admission(skip=True)
        sizes = {sid: [c.n_bytes for c in cps] for sid, cps in slots.items()}
        sizes.setdefault(slot_id, [])
        adm = Admission(skip=False)
        while len(sizes[slot_id]) >= self.max_per_slot:
            sizes[slot_id].pop(0)
            adm.evict_oldest.append(slot_id)
        if self.max_bytes <= 0:
            return adm
        total = sum(sum(v) for v in sizes.values())
        while total + n_bytes > self.max_bytes:
            candidates = [sid for sid, v in sizes.items() if len(v) > 1 and sid not in frozen]
            if not candidates:
                return Admission(skip=True)
            victim = max(candidates, key=lambda sid: (sum(sizes[sid]), -sid))
            total -= sizes[victim].pop(1)  # its oldest after its first
            adm.evict_budget.append(victim)
        return adm

    def admit(
        self,
        slots: dict[int, list[Checkpoint]],
        slot_id: int,
        checkpoint: Checkpoint,
        frozen: Collection[int] = (),
    ) -> list[Checkpoint]:
        """Add `checkpoint` to `slots[slot_id]` under both caps; returns the checkpoints that
        left (their buffers are the caller's to free), the new one itself when it was skipped."""
        adm = self.plan(slots, slot_id, checkpoint.n_bytes, frozen)
        if adm.skip:
            self.skipped(slots, slot_id, checkpoint.n_bytes, checkpoint.n_tokens)
            return [checkpoint]
        gone = []
        for sid in adm.evict_oldest:
            gone.append(slots[sid].pop(0))
            self.counters.evicted_count_total += 1
        for sid in adm.evict_budget:
            old = slots[sid].pop(1)
            gone.append(old)
            self.counters.evicted_budget_total += 1
            log.info(
                "checkpoint budget: evicted slot %d's checkpoint at %d tokens (%d bytes) for slot %d",
                sid, old.n_tokens, old.n_bytes, slot_id,
            )  # fmt: skip
        slots.setdefault(slot_id, []).append(checkpoint)
        return gone

    def skipped(
        self, slots: Mapping[int, Sequence[Checkpoint]], slot_id: int, n_bytes: int, n_tokens: int
    ) -> None:
        """Count and log a checkpoint the budget did not take (`plan` said skip)."""
        self.counters.skipped_budget_total += 1
        log.info(
            "checkpoint budget: skipped a %d-byte checkpoint of slot %d at %d tokens "
            "(%d of %d bytes held, no slot has a checkpoint to spare)",
            n_bytes, slot_id, n_tokens, self.total_bytes(slots), self.max_bytes,
        )  # fmt: skip

    def admit_incoming(
        self,
        slots: Mapping[int, Sequence[Checkpoint]],
        slot_id: int,
        incoming: Sequence[Checkpoint],
    ) -> tuple[list[Checkpoint], list[Checkpoint]]:
        """A page or file brings `incoming` checkpoints (oldest first) to `slot_id`, whose own
        list it replaces: keep as many as both caps allow by dropping the incoming page's own
        oldest checkpoints after its first (never another slot's). Returns (kept, dropped)."""
        keep = list(incoming) if self.max_per_slot > 0 else []
        dropped = [] if keep else list(incoming)
        while len(keep) > self.max_per_slot:
            dropped.append(keep.pop(1))
            self.counters.evicted_count_total += 1
        others = sum(c.n_bytes for sid, cps in slots.items() if sid != slot_id for c in cps)
        while (
            keep and self.max_bytes > 0 and others + sum(c.n_bytes for c in keep) > self.max_bytes
        ):
            dropped.append(keep.pop(1 if len(keep) > 1 else 0))
            self.counters.evicted_budget_total += 1
        if dropped:
            log.info(
                "checkpoint budget: slot %d took %d of %d incoming checkpoints",
                slot_id, len(keep), len(incoming),
            )  # fmt: skip
        return keep, dropped
