"""Moving a slot's whole state between the context and RAM buffers: one copy each way.

`StateMover.measure` sizes what a slot holds (before any copy), `capture` writes it into a
buffer laid out by `core.page.PageLayout` (a page's, or a save's), and `apply` loads a
`core.page.SlotState` (views of a page or of a slot file) into a slot. Called only from the
engine thread. On a failed load the slot is left empty, never holding half a state. A state
carries the LoRA set it was computed under (by adapter hash); `apply` refuses one whose adapters
are not loaded before touching the slot, and otherwise the slot takes that set.

With a draft model, the slot's draft sequence travels too: `measure` first cuts it to its
common prefix with the slot's tokens (its drafted tail is of no use later), and `apply` loads
it back. A state with no draft, or one the draft context refuses, restores with a cold draft
(logged): the draft model re-prefills from the slot's tokens on the next request.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from kvswap.backend.context import Context
from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.page import PageGeometry, PageLayout, SlotState, plan_layout, write_tokens
from kvswap.core.restream import RestreamError, find_stream, restream, stream_count
from kvswap.engine.kv.checkpoints import Checkpoint
from kvswap.engine.kv.memory import SlotMemory
from kvswap.engine.plan.lora import refs_of, resolve
from kvswap.engine.slot import Slot
from kvswap.engine.spec.draft import DraftContext

log = logging.getLogger("kvswap.engine")


class StateMover:
    """Captures and loads slot states on one context."""

    def __init__(
        self,
        ctx: Context,
        memory: SlotMemory,
        geometry: PageGeometry,
        n_vocab: int,
        n_ctx_slot: int,
        adapters: Sequence[AdapterInfo] = (),
        draft: DraftContext | None = None,
    ) -> None:
        self.ctx = ctx
        self.draft = draft
        self.memory = memory
        self.geometry = geometry
        # A plain KV cache: its states' stream headers can be rewritten (`restream`).
        self.plain_kv = not memory.needs_checkpoints
        self.n_vocab = n_vocab
        self.n_ctx_slot = n_ctx_slot
        self.adapters = tuple(adapters)

    def measure(self, slot: Slot) -> PageLayout:
        checkpoints = tuple(
            (c.n_tokens, c.pos_min, c.pos_max, c.n_bytes) for c in self.memory.of(slot)
        )
        draft_bytes, draft_n = None, 0
        if self.draft is not None:
            draft_n = self.draft.keep_prefix_of(slot.id, slot.tokens.view())
            draft_bytes = self.draft.state_size(slot.id) if draft_n > 0 else None
        layout = plan_layout(
            len(slot.tokens),
            self.ctx.state_size(slot.seq_id),
            self.geometry,
            draft_bytes=draft_bytes,
            checkpoints=checkpoints,
            stream=0 if self.geometry.n_stream == 1 else slot.seq_id,
            draft_n_tokens=draft_n,
        )
        return replace(layout, lora=refs_of(slot.lora, self.adapters))

    def capture(self, slot: Slot, buffer: memoryview, layout: PageLayout) -> None:
        """Copy the slot's tokens, state and checkpoints into `buffer` (sized for `layout`)."""
        write_tokens(buffer, layout, slot.tokens.view())
        if layout.token_only:
            return
        t = layout.target
        n = self.ctx.state_get_into(slot.seq_id, buffer[t.offset : t.end])

        if n != t.n_bytes:
            raise KvswapError(
                ErrorKind.SERVER, f"libllama copied {n} state bytes, {t.n_bytes} were measured"
            )
        d = layout.draft
        if d is not None:
            assert self.draft is not None
            n = self.draft.state_get_into(slot.id, buffer[d.offset : d.end])
            if n != d.n_bytes:
                raise KvswapError(
                    ErrorKind.SERVER, f"libllama copied {n} draft bytes, {d.n_bytes} were measured"
                )
        for span, ckpt in zip(layout.checkpoints, self.memory.of(slot), strict=True):
            buffer[span.span.offset : span.span.end] = ckpt.data

    def refusal(self, state: SlotState) -> str | None:
        """Why `state` cannot be loaded into a slot here, or None."""
        n = len(state.tokens)
        if n > self.n_ctx_slot:
            return f"it holds {n} tokens, more than a slot's context ({self.n_ctx_slot})"
        if n and (int(state.tokens.min()) < 0 or int(state.tokens.max()) >= self.n_vocab):
            return "it holds token ids outside the model's vocabulary"
        return None

    def _for_this_cache(self, state: SlotState) -> memoryview | bytearray:
        """The state itself, or a copy with its stream header rewritten for this cache."""
        n_have = self.geometry.n_stream
        try:
            if not self.plain_kv:
                # Their states are several sections: only a page says its stream count.
                if state.n_stream is not None and state.n_stream != n_have:
                    raise RestreamError(
                        f"it was made with {state.n_stream} KV stream(s) and this server runs "
                        f"{n_have}; recurrent, hybrid and sliding-window states cannot be rewritten"
                    )
                return state.target
            n_from = stream_count(state.target)
            if n_from == n_have:
                return state.target
            stream = state.stream if state.stream is not None else find_stream(state.target, n_from)
            return restream(state.target, n_from, stream, n_have)
        except RestreamError as err:
            raise KvswapError(ErrorKind.INVALID_REQUEST, f"cannot load the state: {err}") from err

    def apply(self, slot: Slot, state: SlotState) -> None:
        """Load `state` into `slot`; on failure the slot is empty and a typed 400 is raised."""
        reason = self.refusal(state)
        if reason is not None:
            raise KvswapError(ErrorKind.INVALID_REQUEST, f"cannot load the state: {reason}")
        lora = resolve(state.lora, self.adapters, "the state")  # typed 400, slot untouched
        slot.tokens.truncate(0)
        slot.lora = ()
        self.memory.clear(slot)
        if not self.ctx.state_set_from(slot.seq_id, self._for_this_cache(state)):
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                "libllama refused the state (no room in the KV pool, or a state made for "
                "another model, KV type or stream layout)",
            )
        slot.tokens.replace(state.tokens)
        slot.lora = lora
        incoming = [
            Checkpoint(c.n_tokens, c.pos_min, c.pos_max, c.data, c.data.nbytes)
            for c in state.checkpoints
            if c.n_tokens <= len(state.tokens)
        ]
        # The budget decides on the views; only the checkpoints it keeps are copied, so the
        # bytes in RAM never pass what it allows.
        self.memory.replace(slot, incoming)
        for ckpt in self.memory.of(slot):
            ckpt.data = bytearray(ckpt.data)
        self._apply_draft(slot, state)

    def _apply_draft(self, slot: Slot, state: SlotState) -> None:
        if self.draft is None:
            return
        data: memoryview | bytearray | None = state.draft
        why = "it carries no draft state"
        if state.draft is not None and self.draft.can_cut:
            # A plain KV draft: its stream header is rewritten as the target's is.
            src = state.draft
            try:
                n_from, n_have = stream_count(src), self.geometry.n_stream
                if n_from != n_have:
                    stream = state.stream if state.stream is not None else find_stream(src, n_from)
                    data = restream(src, n_from, stream, n_have)
            except RestreamError as err:
                data, why = None, f"its stream layout cannot be rewritten: {err}"
        if self.draft.load(slot.id, data, state.draft_n_tokens, state.tokens) or not len(
            state.tokens
        ):
            return
        if data is not None:
            why = "libllama refused the draft state"
        log.warning(
            "slot %d: cold draft (%s): the draft model re-prefills %d tokens on the next request",
            slot.id,
            why,
            len(state.tokens),
        )

    def clear_draft(self, slot: Slot) -> None:
        if self.draft is not None:
            self.draft.clear(slot.id)
