"""A shared page's commit record: the manifest, and its JSON form in Redis.

The manifest is written last, by the publish script, and names everything a reader needs: the
generation and fence that wrote it, the token count, the file fingerprint (model and KV types),
the page layout (`core.page.PageLayout`, as a dict), each referenced blob's chunks with
their lengths and CRC-32s, and the plan that rebuilds the page from those blobs (`segments`).
A tokens-only manifest (over budget, or a page with no state) keeps the layout and token count
and references no blob.

Owns the codec; `decode` raises `ManifestError` on anything malformed (the reader turns it into
a miss). Pure.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Final

from kvswap.core.page import CheckpointSpan, LoraRef, PageGeometry, PageLayout, Span
from kvswap.tiers.shared.segments import Extent, Literal, PagePlan, Section, SectionPlan

FORMAT: Final = "kvswap-shared-page"
VERSION: Final = 2  # 2: extents carry a BLAKE2b-128 digest (1: a CRC-32)


class ManifestError(ValueError):
    """The manifest cannot be read."""


@dataclass(frozen=True)
class BlobRef:
    """Generation `gen`'s blob: `n_bytes` in chunks of `chunk_bytes` (the last may be short)."""

    gen: int
    n_bytes: int
    chunk_bytes: int
    crcs: tuple[int, ...]  # one per chunk

    def chunk_sizes(self) -> list[int]:
        return [
            min(self.chunk_bytes, self.n_bytes - i)
            for i in range(0, self.n_bytes, self.chunk_bytes)
        ]


@dataclass(frozen=True)
class Manifest:
    mind_key: str
    gen: int
    fence: int
    replica_id: str
    n_tokens: int
    fingerprint: str  # PageGeometry.file_fingerprint()
    layout: PageLayout
    tokens_only: bool
    plan: PagePlan | None  # None when tokens_only
    blobs: tuple[BlobRef, ...]
    t_unix_ms: int

    @property
    def n_bytes_stored(self) -> int:
        return sum(b.n_bytes for b in self.blobs)


def layout_to_dict(layout: PageLayout) -> dict[str, Any]:
    g = layout.geometry
    return {
        "n_tokens": layout.n_tokens,
        "tokens": [layout.tokens.offset, layout.tokens.n_bytes],
        "target": [layout.target.offset, layout.target.n_bytes],
        "geometry": [g.model_fingerprint, g.cache_type_k, g.cache_type_v, g.n_stream, g.n_ctx_slot],
        "draft": None if layout.draft is None else [layout.draft.offset, layout.draft.n_bytes],
        "draft_n_tokens": layout.draft_n_tokens,
        "checkpoints": [
            [c.n_tokens, c.pos_min, c.pos_max, c.span.offset, c.span.n_bytes]
            for c in layout.checkpoints
        ],
        "lora": [[r.sha256, r.path, r.scale] for r in layout.lora],
        "stream": layout.stream,
        "token_only": layout.token_only,
    }


def layout_from_dict(d: dict[str, Any]) -> PageLayout:
    fp, ctk, ctv, n_stream, n_ctx_slot = d["geometry"]
    return PageLayout(
        n_tokens=int(d["n_tokens"]),
        tokens=Span(*map(int, d["tokens"])),
        target=Span(*map(int, d["target"])),
        geometry=PageGeometry(str(fp), str(ctk), str(ctv), int(n_stream), int(n_ctx_slot)),
        draft=None if d["draft"] is None else Span(*map(int, d["draft"])),
        draft_n_tokens=int(d["draft_n_tokens"]),
        checkpoints=tuple(
            CheckpointSpan(int(n), int(p0), int(p1), Span(int(off), int(nb)))
            for n, p0, p1, off, nb in d["checkpoints"]
        ),
        lora=tuple(LoraRef(str(s), str(p), float(sc)) for s, p, sc in d["lora"]),
        stream=int(d["stream"]),
        token_only=bool(d["token_only"]),
    )


def encode(m: Manifest) -> bytes:
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "mind": m.mind_key,
        "gen": m.gen,
        "fence": m.fence,
        "replica": m.replica_id,
        "n_tokens": m.n_tokens,
        "fingerprint": m.fingerprint,
        "layout": layout_to_dict(m.layout),
        "tokens_only": m.tokens_only,
        "t_unix_ms": m.t_unix_ms,
        "blobs": [[b.gen, b.n_bytes, b.chunk_bytes, list(b.crcs)] for b in m.blobs],
    }
    if m.plan is not None:
        doc["n_bytes"] = m.plan.n_bytes
        doc["sections"] = [
            [
                sp.section.name,
                sp.section.offset,
                sp.section.n_rows,
                sp.section.row_bytes,
                [[e.gen, e.blob_offset, e.width, e.digest.hex()] for e in sp.extents],
            ]
            for sp in m.plan.sections
        ]
        doc["literals"] = [
            [lit.offset, base64.b64encode(lit.data).decode("ascii")] for lit in m.plan.literals
        ]
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def decode(body: bytes) -> Manifest:
    try:
        doc = json.loads(body)
        if doc.get("format") != FORMAT or doc.get("version") not in (1, VERSION):
            raise ManifestError(f"not a {FORMAT} v1 or v{VERSION} manifest")
        plan = None
        if not doc["tokens_only"]:
            plan = PagePlan(
                int(doc["n_bytes"]),
                tuple(
                    SectionPlan(
                        Section(str(name), int(off), int(rows), int(row)),
                        tuple(Extent(int(g), int(o), int(w), _digest(c)) for g, o, w, c in extents),
                    )
                    for name, off, rows, row, extents in doc["sections"]
                ),
                tuple(Literal(int(o), base64.b64decode(t)) for o, t in doc["literals"]),
            )
        manifest = Manifest(
            mind_key=str(doc["mind"]),
            gen=int(doc["gen"]),
            fence=int(doc["fence"]),
            replica_id=str(doc["replica"]),
            n_tokens=int(doc["n_tokens"]),
            fingerprint=str(doc["fingerprint"]),
            layout=layout_from_dict(doc["layout"]),
            tokens_only=bool(doc["tokens_only"]),
            plan=plan,
            blobs=tuple(
                BlobRef(int(g), int(n), int(cb), tuple(int(c) for c in crcs))
                for g, n, cb, crcs in doc["blobs"]
            ),
            t_unix_ms=int(doc["t_unix_ms"]),
        )
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError) as err:  # json, shapes, base64 (binascii.Error)
        raise ManifestError(f"malformed manifest: {err}") from err
    _check(manifest)
    return manifest


def _digest(value: object) -> bytes:
    """An extent's digest: hex (v2); a v1 manifest's CRC-32 (an int) reads as none, so its
    extents are read back but never reused by a new generation."""
    return bytes.fromhex(value) if isinstance(value, str) else b""


def _check(m: Manifest) -> None:
    """Every extent inside its blob and its section, every blob's CRC list complete."""
    blobs = {b.gen: b for b in m.blobs}
    for b in m.blobs:
        if b.chunk_bytes <= 0 or b.n_bytes < 0 or len(b.crcs) != len(b.chunk_sizes()):
            raise ManifestError(f"blob of generation {b.gen} is inconsistent")
    if m.plan is None:
        if m.blobs:
            raise ManifestError("a tokens-only manifest references blobs")
        return
    for sp in m.plan.sections:
        s = sp.section
        if s.offset < 0 or s.offset + s.n_bytes > m.plan.n_bytes:
            raise ManifestError(f"section {s.name} lies outside the page")
        if sum(e.width for e in sp.extents) != s.row_bytes:
            raise ManifestError(f"the extents of section {s.name} do not cover it")
        for e in sp.extents:
            blob = blobs.get(e.gen)
            if blob is None or e.blob_offset + e.width * s.n_rows > blob.n_bytes:
                raise ManifestError(f"an extent of section {s.name} lies outside its blob")
