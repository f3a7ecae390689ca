"""The draft model's context: one sequence per slot, mirroring the slot's tokens at the same
positions, and greedy drafting from it.

Owns the draft `Context`, its batch, and per slot a `TokenBuffer` that always equals what the
draft KV holds for that slot's sequence (as `Slot.tokens` does for the target). The mirror is
synced lazily: before the draft model sees new tokens, its sequence is cut back to the longest
common prefix with the slot's tokens (draft positions past the last accepted token go), then the
missing tokens are decoded. A draft whose memory cannot be cut (recurrent, hybrid, sliding
window) keeps one partial snapshot per slot, taken where drafting starts, and restores it
instead of cutting; with no usable snapshot the slot's draft goes cold and is re-prefilled.

    target KV   t0 .. t9            pending p     (slot.tokens + [p])
    draft KV    t0 .. t9 p d0 d1    after drafting d0 d1 d2 (d2 never decoded)
    next step   target accepted p d0, sampled q:  draft cut to t0..t9 p d0, decodes q, drafts

Drafting follows the pinned llama-server's draft-simple: each slot's top token of a top-10
softmax, stopping below `p_min` or at the slot's cap; every slot drafts in one batch per depth.
Engine thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvswap.backend.batch import Batch
from kvswap.backend.context import FLAGS_PARTIAL_ONLY, Context, ContextParams
from kvswap.backend.model import Model
from kvswap.engine.tokens import TokenBuffer

log = logging.getLogger("kvswap.draft")

TokenArray = npt.NDArray[np.int32]

_TOP_K = 10  # llama-server's draft sampler: top-k 10, then the top candidate's probability


@dataclass(frozen=True)
class DraftJob:
    """One slot asking for a draft: its tokens so far (the last one just sampled)."""

    slot_id: int
    tokens: TokenArray  # slot.tokens + [pending]
    n_max: int


@dataclass
class DraftResult:
    tokens: list[int]
    n_kept: int  # the draft model decoded the job's tokens from this position on


@dataclass
class _Snapshot:
    n_tokens: int
    data: bytearray


def top_probability(logits: npt.NDArray[np.float32]) -> tuple[int, float]:
    """The most likely token and its probability within the top-k (llama-server's draft p)."""
    k = min(_TOP_K, len(logits))
    top = np.argpartition(logits, -k)[-k:]
    vals = logits[top].astype(np.float64)
    best = int(np.argmax(vals))
    e = np.exp(vals - vals[best])
    return int(top[best]), float(1.0 / e.sum())


class DraftContext:
    """A draft model's context with one mirrored sequence per slot."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        self.model = model
        self.ctx = Context(model, params)
        self.batch = Batch(params.n_batch)
        self.mirrors = [TokenBuffer() for _ in range(params.n_seq_max)]
        info = model.info
        self.can_cut = not (info.is_recurrent or info.is_hybrid or info.n_swa > 0)
        self._snapshots: dict[int, _Snapshot] = {}
        self.rows: dict[int, int] = {}  # slot -> logits row of its last token, after `_feed`

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()

    # -- keeping the mirror ------------------------------------------------------------------

    def clear(self, slot_id: int) -> None:
        self.ctx.seq_clear(slot_id)
        self.mirrors[slot_id].truncate(0)
        self._snapshots.pop(slot_id, None)

    def cut(self, slot_id: int, n: int) -> int:
        """Keep at most the first `n` tokens of the slot's draft sequence; returns what is kept."""
        mirror = self.mirrors[slot_id]
        if n >= len(mirror):
            return len(mirror)
        if n > 0 and self.can_cut and self.ctx.seq_rm(slot_id, n, -1):
            mirror.truncate(n)
            return n
        snap = self._snapshots.get(slot_id)
        if (
            snap is not None
            and 0 < snap.n_tokens <= n
            and self.ctx.state_set_from(slot_id, snap.data, FLAGS_PARTIAL_ONLY)
            and self.ctx.seq_rm(slot_id, snap.n_tokens, -1)
        ):
            mirror.truncate(snap.n_tokens)
            return snap.n_tokens
        self.clear(slot_id)
        return 0

    def keep_prefix_of(self, slot_id: int, tokens: TokenArray) -> int:
        """Cut the draft sequence to its common prefix with `tokens`; returns its length."""
        return self.cut(slot_id, self.mirrors[slot_id].common_prefix(tokens))

    def _snapshot(self, slot_id: int) -> None:
        if self.can_cut:
            return
        size = self.ctx.state_size(slot_id, FLAGS_PARTIAL_ONLY)
        data = bytearray(size)
        if self.ctx.state_get_into(slot_id, data, FLAGS_PARTIAL_ONLY) == size:
            self._snapshots[slot_id] = _Snapshot(len(self.mirrors[slot_id]), data)
        else:
            self._snapshots.pop(slot_id, None)

    def _decode(self) -> bool:
        rc = self.ctx.decode(self.batch)
        if rc != 0:
            log.warning("draft decode failed (%d): the affected drafts go cold", rc)
        return rc == 0

    def sync(self, jobs: list[tuple[int, TokenArray]]) -> dict[int, int]:
        """Bring each slot's draft sequence to `tokens` (no logits); returns, per slot, where
        the draft model started decoding (tokens before it were already there)."""
        kept: dict[int, int] = {}
        spans: list[tuple[int, TokenArray, int]] = []
        for slot_id, tokens in jobs:
            kept[slot_id] = self.keep_prefix_of(slot_id, tokens)
            if kept[slot_id] < len(tokens):
                spans.append((slot_id, tokens[kept[slot_id] :], kept[slot_id]))
        if spans and not self._feed(spans, want_last=False):
            for slot_id, _, _ in spans:
                self.clear(slot_id)
        return kept

    def _feed(self, spans: list[tuple[int, TokenArray, int]], want_last: bool) -> bool:
        """Decode spans (slot, tokens, pos0) in batch-sized chunks. With `want_last`, the last
        token of every span gets logits, all in the final decode (its row: `self.rows`)."""
        self.rows = {}
        cap = self.batch.capacity
        if want_last and sum(len(t) for _, t, _ in spans) > cap:
            # Too much for one decode: the bodies first, then every span's last token.
            bodies = [(s, t[:-1], p) for s, t, p in spans if len(t) > 1]
            if not self._feed(bodies, want_last=False):
                return False
            spans = [(s, t[-1:], p + len(t) - 1) for s, t, p in spans]
        self.batch.clear()
        for slot_id, toks, pos0 in spans:
            off = 0
            while off < len(toks):
                if self.batch.n_tokens == cap:
                    if not self._decode():
                        return False
                    self.batch.clear()
                part = toks[off : off + cap - self.batch.n_tokens]
                last = want_last and off + len(part) == len(toks)
                row = self.batch.add_span(part, pos0 + off, slot_id, last)
                self.mirrors[slot_id].append(part)
                off += len(part)
                if last:
                    self.rows[slot_id] = row
        return self.batch.n_tokens == 0 or self._decode()

    # -- drafting ---------------------------------------------------------------------------

    def draft(self, jobs: list[DraftJob], p_min: float, n_min: int) -> dict[int, DraftResult]:
        """Draft up to each job's `n_max` tokens after its tokens, all slots batched per depth."""
        spans: list[tuple[int, TokenArray, int]] = []
        n_kept: dict[int, int] = {}
        for job in jobs:
            # At least the last token is decoded: its logits start the draft.
            kept = self.cut(job.slot_id, min(len(job.tokens) - 1, self._common(job)))
            spans.append((job.slot_id, job.tokens[kept:], kept))
            n_kept[job.slot_id] = kept
        if not self._feed(spans, want_last=True):
            for job in jobs:
                self.clear(job.slot_id)
            return {}
        results = {j.slot_id: DraftResult([], n_kept[j.slot_id]) for j in jobs}
        for job in jobs:
            self._snapshot(job.slot_id)  # where the next cut may have to come back to
        active = {j.slot_id: j for j in jobs if j.n_max > 0}
        rows = dict(self.rows)
        while active:
            self.batch.clear()
            next_rows: dict[int, int] = {}
            for slot_id, job in list(active.items()):
                token, p = top_probability(self.ctx.logits(rows[slot_id]))
                out = results[slot_id].tokens
                if p < p_min:
                    del active[slot_id]
                    continue
                out.append(token)
                if len(out) >= job.n_max:
                    del active[slot_id]
                    continue
                pos = len(self.mirrors[slot_id])
                next_rows[slot_id] = self.batch.add_span(
                    np.array([token], dtype=np.int32), pos, slot_id, True
                )
                self.mirrors[slot_id].append([token])
            if not next_rows:
                break
            if not self._decode():
                for slot_id in next_rows:
                    self.clear(slot_id)
                break
            rows = next_rows
        for r in results.values():
            if len(r.tokens) < n_min:
                r.tokens.clear()
        return results

    def _common(self, job: DraftJob) -> int:
        return self.mirrors[job.slot_id].common_prefix(job.tokens)

    # -- pages and slot files -----------------------------------------------------------------

    def state_size(self, slot_id: int) -> int:
        return self.ctx.state_size(slot_id) if len(self.mirrors[slot_id]) else 0

    def state_get_into(self, slot_id: int, buf: memoryview) -> int:
        return self.ctx.state_get_into(slot_id, buf)

    def load(
        self, slot_id: int, data: memoryview | bytearray | None, n_tokens: int, tokens: TokenArray
    ) -> bool:
        """Load a draft state holding the first `n_tokens` of `tokens`; False: the draft is cold."""
        self.clear(slot_id)
        if data is None or n_tokens <= 0 or n_tokens > len(tokens):
            return False
        if not self.ctx.state_set_from(slot_id, data):
            return False
        self.mirrors[slot_id].replace(tokens[:n_tokens])
        return True
