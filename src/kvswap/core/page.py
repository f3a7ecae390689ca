"""What a page (or a captured slot) holds, where each part lies in its one buffer, and the
views of those parts that a slot loads.

A page is one flat buffer laid out as

    [ tokens (int32 x n_tokens) | target state | draft state | checkpoint 0 | checkpoint 1 | ... ]

with `PageLayout` saying where each part is, plus what has no bytes: the geometry (model
fingerprint, KV types, stream count) and the LoRA set the state was computed under. The same
layout describes a slot captured for `save`, so page files and slot files have one writer
(`tiers.slotfiles`). States carry libllama's 8-byte RAM prefix, ready for
`llama_state_seq_set_data`. `SlotState` is such a state as views of someone else's buffer (a
page, a slot file, a shared-tier page), ready for the engine's `StateMover.apply`.

The page format is every tier's vocabulary: the engine writes and loads it, the disk and shared
tiers store it. Pure: offsets, sizes and views only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

TOKEN_BYTES = 4


@dataclass(frozen=True)
class Span:
    """A byte range of the buffer."""

    offset: int
    n_bytes: int

    @property
    def end(self) -> int:
        return self.offset + self.n_bytes


@dataclass(frozen=True)
class CheckpointSpan:
    """A context checkpoint: the partial state after `n_tokens` tokens."""

    n_tokens: int
    pos_min: int
    pos_max: int
    span: Span


@dataclass(frozen=True)
class LoraRef:
    """An adapter the state was computed under, named by content, not by load order."""

    sha256: str  # of the adapter file
    path: str  # where it was loaded from (informative)
    scale: float


@dataclass(frozen=True)
class PageGeometry:
    """What a state can only be loaded into: the same model, KV types and stream layout."""

    model_fingerprint: str
    cache_type_k: str
    cache_type_v: str
    n_stream: int  # 1 with unified KV, else n_parallel (a state records its stream count)
    n_ctx_slot: int  # the window it was made in (informative: a page fits any larger window)

    def file_fingerprint(self) -> str:
        """The fingerprint recorded in slot files: a mismatch is a typed 'wrong model' 400."""
        return f"{self.model_fingerprint};k={self.cache_type_k};v={self.cache_type_v}"

    def refusal(self, other: PageGeometry) -> str | None:
        """Why a state made under `self` cannot load under `other`, or None when it can."""
        if self.model_fingerprint != other.model_fingerprint:
            return "the page was made with another model"
        if (self.cache_type_k, self.cache_type_v) != (other.cache_type_k, other.cache_type_v):
            return (
                f"the page was made with KV types {self.cache_type_k}/{self.cache_type_v}, "
                f"the server runs {other.cache_type_k}/{other.cache_type_v}"
            )
        # A different stream count is the loader's business: it rewrites plain KV states.
        return None


@dataclass(frozen=True)
class PageLayout:
    """Where each part of a page lies in its buffer."""

    n_tokens: int
    tokens: Span
    target: Span
    geometry: PageGeometry
    draft: Span | None = None
    draft_n_tokens: int = 0  # the draft state holds the first this-many of `tokens`
    checkpoints: tuple[CheckpointSpan, ...] = field(default_factory=tuple)
    lora: tuple[LoraRef, ...] = ()  # the adapter set the KV was computed under (empty: none)
    stream: int = 0  # the KV stream the state was taken from (its slot without unified KV)
    token_only: bool = False  # no state (a KV type change dropped it): re-prefilled on page_in

    @property
    def n_bytes(self) -> int:
        ends = [self.tokens.end, self.target.end]
        if self.draft is not None:
            ends.append(self.draft.end)
        ends += [c.span.end for c in self.checkpoints]
        return max(ends)

    @property
    def n_bytes_spec(self) -> int:
        return self.draft.n_bytes if self.draft is not None else 0


def plan_layout(
    n_tokens: int,
    target_bytes: int,
    geometry: PageGeometry,
    draft_bytes: int | None = None,
    checkpoints: tuple[tuple[int, int, int, int], ...] = (),
    stream: int = 0,
    draft_n_tokens: int = 0,
) -> PageLayout:
    """Lay the parts out back to back; `checkpoints` are (n_tokens, pos_min, pos_max, n_bytes)."""
    tokens = Span(0, n_tokens * TOKEN_BYTES)
    target = Span(tokens.end, target_bytes)
    end = target.end
    draft = None
    if draft_bytes is not None:
        draft = Span(end, draft_bytes)
        end = draft.end
    spans = []
    for n_cp_tokens, pos_min, pos_max, n in checkpoints:
        spans.append(CheckpointSpan(n_cp_tokens, pos_min, pos_max, Span(end, n)))
        end += n
    return PageLayout(
        n_tokens, tokens, target, geometry, draft, draft_n_tokens, tuple(spans), stream=stream
    )


def read_tokens(buffer: memoryview, layout: PageLayout) -> npt.NDArray[np.int32]:
    """A copy of the page's tokens (no view of the buffer survives)."""
    span = layout.tokens
    return np.frombuffer(buffer[span.offset : span.end], dtype=np.int32).copy()


def write_tokens(buffer: memoryview, layout: PageLayout, tokens: npt.NDArray[np.int32]) -> None:
    span = layout.tokens
    buffer[span.offset : span.end] = np.ascontiguousarray(tokens, dtype=np.int32).tobytes()


@dataclass(frozen=True)
class CheckpointView:
    """A checkpoint in someone else's buffer (a page, a slot file)."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: memoryview


@dataclass(frozen=True)
class SlotState:
    """A slot's state in RAM, ready to load (views of buffers that someone else owns)."""

    tokens: npt.NDArray[np.int32]
    target: memoryview  # libllama's 8-byte prefix + payload
    draft: memoryview | None = None  # the draft model's state, with its 8-byte prefix
    draft_n_tokens: int = 0  # the draft state holds the first this-many tokens
    checkpoints: tuple[CheckpointView, ...] = field(default_factory=tuple)
    stream: int | None = None  # the KV stream it was taken from; None: find it in the state
    n_stream: int | None = None  # the stream count of the cache it was taken from, if known
    lora: tuple[LoraRef, ...] = ()  # the LoRA set it was computed under (empty: none)

    @property
    def n_bytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft is not None else 0)

    def release(self) -> None:
        """Release every view (before the buffers they view are closed)."""
        self.target.release()
        if self.draft is not None:
            self.draft.release()
        for c in self.checkpoints:
            c.data.release()


def state_of_page(buffer: memoryview, layout: PageLayout) -> SlotState:
    """Views of a page's parts (the caller keeps the page alive while they are used)."""
    t, d = layout.target, layout.draft
    return SlotState(
        tokens=read_tokens(buffer, layout),
        target=buffer[t.offset : t.end],
        draft=buffer[d.offset : d.end] if d is not None else None,
        draft_n_tokens=layout.draft_n_tokens,
        stream=layout.stream,
        n_stream=layout.geometry.n_stream,
        lora=layout.lora,
        checkpoints=tuple(
            CheckpointView(c.n_tokens, c.pos_min, c.pos_max, buffer[c.span.offset : c.span.end])
            for c in layout.checkpoints
        ),
    )
