"""Response bodies of the page verbs and GET /pages (kvswap's own).

Pure: engine results in, JSON-able dicts out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvswap.engine.commands import PageMoved
from kvswap.engine.kv.pagestore import PageInfo
from kvswap.engine.seats.registry import MindView


def page_moved_json(m: PageMoved, *, page_in: bool) -> dict[str, Any]:
    """page_out / page_in: what moved and how long it took."""
    out: dict[str, Any] = {
        "id_slot": m.slot_id,
        "page": m.key.name,
        "n_tokens": m.n_tokens,
        "n_bytes": m.n_bytes,
        "n_bytes_spec": m.n_bytes_spec,
        "n_checkpoints": m.n_checkpoints,
        "timings": {("page_in_ms" if page_in else "page_out_ms"): m.t_ms},
    }
    if not page_in:
        out["timings"]["copy_ms"] = m.copy_ms
    if page_in:
        out["n_discarded"] = m.n_discarded
    return out


def spill_json(
    page: str, filename: str, n_tokens: int, n_written: int, dropped: bool, ms: float
) -> dict[str, Any]:
    return {
        "page": page,
        "filename": filename,
        "n_tokens": n_tokens,
        "n_written": n_written,
        "dropped": dropped,
        "timings": {"spill_ms": ms},
    }


def _page_json(p: PageInfo) -> dict[str, Any]:
    return {
        "name": p.key.name,
        "generation": p.generation,
        "n_bytes": p.n_bytes,
        "n_tokens": p.n_tokens,
        "age_s": round(p.age_s, 3),
        "n_spills": p.n_spills,
        "lora": [{"sha256": r.sha256, "path": r.path, "scale": r.scale} for r in p.lora],
    }


def pages_json(infos: Sequence[PageInfo], n_bytes: int, ceiling_bytes: int) -> dict[str, Any]:
    """The caller's pages in the store, and their generations only running spills still hold;
    the store's totals."""
    return {
        "n_bytes": n_bytes,
        "ceiling_bytes": ceiling_bytes,
        "pages": [_page_json(p) for p in infos if p.in_store],
        "held_by_spills": [_page_json(p) for p in infos if not p.in_store],
    }


def minds_json(views: Sequence[MindView], now_unix_s: float) -> list[dict[str, Any]]:
    """Every mind with its live tier (slot, ram, disk), tokens, bytes and last use."""
    return [
        {
            "mind": v.key.name,
            "namespace": v.key.namespace,
            "tier": v.tier,
            "id_slot": v.slot_id,
            "n_tokens": v.n_tokens,
            "n_bytes": v.n_bytes,
            "last_used_unix_s": round(v.last_used_unix_s, 3),
            "idle_s": round(max(0.0, now_unix_s - v.last_used_unix_s), 3),
            "on_disk": v.on_disk,
            "n_tokens_on_disk": v.n_tokens_on_disk,
        }
        for v in views
    ]
