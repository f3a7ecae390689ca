"""A slot's memory on the context: cutting it back, and its context checkpoints.

`SlotMemory.cut(slot, n)` keeps the first `n` tokens of a slot when the memory allows it, else
restores the newest checkpoint at or before `n` (restore first, then cut the tail: the order
that keeps hybrids exact), else clears the slot. A sliding window is judged by
`llama_memory_seq_pos_min`, never by `seq_rm`'s answer. `capture` takes a checkpoint
(`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`) of a slot as it stands, under `CheckpointBudget`.

Engine thread only. Checkpoint bytes are plain `bytearray`s owned by the slot's list; a page or
slot file carries copies of them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from kvswap.backend.context import FLAGS_PARTIAL_ONLY, Context
from kvswap.engine.kv.checkpoints import Checkpoint, CheckpointBudget, boundaries, newest_usable
from kvswap.engine.slot import Slot

log = logging.getLogger("kvswap.checkpoints")


class SlotMemory:
    """Cuts and checkpoints for one context's slots."""

    def __init__(
        self,
        ctx: Context,
        *,
        needs_checkpoints: bool,
        swa_window: int,
        budget: CheckpointBudget,
        n_ubatch: int,
        min_step: int,
    ) -> None:
        self.ctx = ctx
        self.needs_checkpoints = needs_checkpoints
        self.swa_window = swa_window
        self.budget = budget
        self.n_ubatch = n_ubatch
        self.min_step = min_step
        self.slots: dict[int, list[Checkpoint]] = {}

    # -- checkpoints ------------------------------------------------------------------------

    def plan(self, n_prompt: int, n_done: int) -> list[int]:
        """Where this prompt's checkpoints go (token counts), none when the memory can be cut."""
        if not self.needs_checkpoints or self.budget.max_per_slot <= 0:
            return []
        return boundaries(n_prompt, n_done, self.n_ubatch, self.min_step)

    def of(self, slot: Slot) -> list[Checkpoint]:
        return self.slots.setdefault(slot.id, [])

    @property
    def total_bytes(self) -> int:
        return CheckpointBudget.total_bytes(self.slots)

    def capture(self, slot: Slot, frozen: Collection[int] = ()) -> None:
        """Checkpoint the slot as it stands now (before the batch that extends it). The budget
        takes no checkpoint from a slot in `frozen` (one whose capture is waiting for its
        buffer: its page layout already counts those checkpoints)."""
        seq = slot.seq_id
        size = self.ctx.state_size(seq, FLAGS_PARTIAL_ONLY)
        if self.budget.plan(self.slots, slot.id, size, frozen).skip:
            # Decided before the copy: a checkpoint the budget refuses is never allocated.
            self.budget.skipped(self.slots, slot.id, size, len(slot.tokens))
            return
        data = bytearray(size)
        if self.ctx.state_get_into(seq, data, FLAGS_PARTIAL_ONLY) != size:
            log.warning(
                "slot %d: libllama could not copy a checkpoint at %d tokens",
                slot.id,
                len(slot.tokens),
            )
            return
        n = len(slot.tokens)
        ckpt = Checkpoint(n, self.ctx.seq_pos_min(seq), self.ctx.seq_pos_max(seq), data, size)
        self.of(slot)
        self.budget.admit(self.slots, slot.id, ckpt, frozen)
        log.debug("slot %d: checkpoint at %d tokens (%d bytes)", slot.id, n, size)

    def replace(self, slot: Slot, incoming: list[Checkpoint]) -> None:
        """A page or file brings its checkpoints back; the budget drops its own oldest first."""
        kept, _ = self.budget.admit_incoming(self.slots, slot.id, incoming)
        self.slots[slot.id] = kept

    def drop_after(self, slot: Slot, n_tokens: int) -> None:
        cps = self.of(slot)
        cps[:] = [c for c in cps if c.n_tokens <= n_tokens]

    def clear(self, slot: Slot) -> None:
        self.slots[slot.id] = []

    def check_integrity(self, n_tokens: dict[int, int]) -> None:
        """Assert the checkpoints agree with their slots (`n_tokens`: slot id -> tokens held)
        and with the budget: each one's bytes are its buffer's, none lies past its slot's
        tokens, they run oldest first, and both caps hold."""
        budget = self.budget
        for slot_id, cps in self.slots.items():
            assert slot_id in n_tokens, f"checkpoints of a slot that does not exist: {slot_id}"
            assert [c.n_tokens for c in cps] == sorted(c.n_tokens for c in cps), slot_id
            for c in cps:
                assert c.n_bytes == len(c.data), (slot_id, c.n_tokens)
                assert c.n_tokens <= n_tokens[slot_id], (slot_id, c.n_tokens)
            assert budget.max_per_slot <= 0 or len(cps) <= budget.max_per_slot, slot_id
        if budget.max_bytes > 0:
            assert self.total_bytes <= budget.max_bytes, (self.total_bytes, budget.max_bytes)

    # -- cutting ----------------------------------------------------------------------------

    def cut(self, slot: Slot, n: int) -> int:
        """Keep at most the first `n` tokens; returns how many are kept."""
        if n >= len(slot.tokens):
            return len(slot.tokens)
        seq = slot.seq_id
        # Judge the window before cutting: after a cut the slid-out cells are gone and pos_min
        # no longer tells whether the positions before `n` were still there.
        if n > 0 and self._window_intact(seq, n) and self.ctx.seq_rm(seq, n, -1):
            kept = n
        else:
            kept = self._restore(slot, n)
        slot.tokens.truncate(kept)
        self.drop_after(slot, kept)
        return kept

    def _window_intact(self, seq: int, n: int) -> bool:
        # Attention from position n needs the window before it: it must still be there.
        return self.swa_window <= 0 or self.ctx.seq_pos_min(seq) <= max(0, n - self.swa_window)

    def _restore(self, slot: Slot, n: int) -> int:
        seq = slot.seq_id
        ckpt = newest_usable(self.of(slot), n) if self.needs_checkpoints else None
        if ckpt is not None:
            # Restore first, then cut the tail (the other order leaves a hybrid's attention
            # cells in place and gives wrong logits).
            if self.ctx.state_set_from(seq, ckpt.data, FLAGS_PARTIAL_ONLY) and self.ctx.seq_rm(
                seq, ckpt.n_tokens, -1
            ):
                log.debug("slot %d: restored the checkpoint at %d tokens", slot.id, ckpt.n_tokens)
                return ckpt.n_tokens
            log.warning(
                "slot %d: the checkpoint at %d tokens did not restore", slot.id, ckpt.n_tokens
            )
        self.ctx.seq_clear(seq)
        return 0
