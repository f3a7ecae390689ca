"""The shared tier's part of /props, /pages and /metrics (kvswap's own; a replica of a cluster).

Pure: the tier's view (`tiers.shared.replica.TierView`) in, JSON-able dicts and Prometheus
series out. Rates are means over the replica's life: bytes moved over the seconds spent.
"""

from __future__ import annotations

from typing import Any

from kvswap.server.prometheus import Metric
from kvswap.tiers.shared.replica import TierView


def props_json(view: TierView) -> dict[str, Any]:
    """/props `cluster`: this replica and its tier."""
    return {
        "replica_id": view.replica_id,
        "advertise_url": view.advertise_url,
        "shared_tier": view.url,
        "lease_ms": view.lease_ms,
        "rpo_tokens": view.rpo_tokens,
        "rpo_seconds": view.rpo_s,
        "shared_tier_bytes": view.budget_bytes,
    }


def _rate(n_bytes: float, seconds: float) -> float:
    return n_bytes / seconds if seconds > 0 else 0.0


def pages_json(view: TierView, namespace: str) -> dict[str, Any]:
    """/pages `shared_tier`: the tier's state as this replica sees it; `held` lists the minds
    of tenant `namespace` only, by name (as /pages `minds` does)."""
    store, r = view.store, view.resumes
    return {
        **props_json(view),
        "reachable": view.reachable,
        "n_unreachable": view.n_unreachable,
        "tier_bytes": view.tier_bytes,
        "redis_used_bytes": view.redis_used_bytes,
        "publishes": {
            "n": store.n_publish,
            "n_delta": store.n_publish_delta,
            "n_tokens_only": store.n_publish_tokens_only,
            "n_stale_rejected": store.n_publish_stale,
            "n_failed": view.writer["n_publish_failed"],
            "bytes_written": store.bytes_written,
            "bytes_reused": store.bytes_reused,
            "seconds": round(store.publish_s, 6),
            "bytes_per_second": round(_rate(store.bytes_written, store.publish_s)),
            "n_before_answer": view.writer["n_publish_turn"],
            "n_behind": view.writer["n_publish_behind"],
        },
        "fetches": {
            "n": store.n_fetch,
            "n_hits": store.n_fetch_hit,
            "misses": store.misses,
            "bytes_read": store.bytes_read,
            "seconds": round(store.fetch_s, 6),
            "bytes_per_second": round(_rate(store.bytes_read, store.fetch_s)),
        },
        "token_log": view.token_log,
        "resumes": {k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()},
        "minds_lost": view.writer["n_lost"],
        "replicas": None
        if view.replicas is None
        else [
            {"id": r.replica_id, "url": r.url, "state": r.state, "n_restarts": r.n_restarts}
            for r in view.replicas
        ],
        "handoffs": view.writer["n_handoffs"],
        "held": [
            {
                "mind": h.key.name,
                "fence": h.fence,
                "n_tokens": h.n_tokens,
                "n_published": h.n_published,
                "n_unpublished": h.n_unpublished,
                "published_gen": h.published_gen,
                "dirty": h.dirty,
            }
            for h in view.held
            if h.key.namespace == namespace
        ],
    }


def metrics(view: TierView) -> list[Metric]:
    """The `llamacpp:shared_*` series."""
    store, r, w = view.store, view.resumes, view.writer
    n_misses = sum(store.misses.values())
    n_stale = store.n_publish_stale + view.token_log["n_stale"]

    def c(name: str, help_text: str, value: float) -> Metric:
        return Metric(name, "counter", help_text, float(value))

    def g(name: str, help_text: str, value: float) -> Metric:
        return Metric(name, "gauge", help_text, float(value))

    return [
        c("shared_publish_total", "Pages published to the shared tier", store.n_publish),
        c("shared_publish_delta_total", "... that reused older chunks", store.n_publish_delta),
        c("shared_publish_stale_total", "Writes refused by the fence (a stale owner)", n_stale),
        c("shared_publish_failed_total", "Publications that failed (Redis away)",
          w["n_publish_failed"]),
        c("shared_token_log_failed_total", "Token-log appends that failed (Redis away)",
          w["n_log_failed"]),
        c("shared_bytes_written_total", "Page bytes written", store.bytes_written),
        c("shared_publish_seconds_total", "Seconds spent publishing", store.publish_s),
        c("shared_fetch_total", "Pages fetched from the shared tier", store.n_fetch),
        c("shared_fetch_misses_total", "Fetches that missed and fell back", n_misses),
        c("shared_bytes_read_total", "Page bytes read", store.bytes_read),
        c("shared_fetch_seconds_total", "Seconds spent fetching", store.fetch_s),
        c("shared_token_appends_total", "Token-log appends", view.token_log["n_appends"]),
        c("shared_resumes_total", "Minds taken over and resumed here", r["n_resumes"]),
        c("shared_resume_lease_wait_seconds_total", "... waiting out a lease", r["lease_wait_s"]),
        c("shared_resume_fetch_seconds_total", "... fetching the page", r["fetch_s"]),
        c("shared_resume_verify_seconds_total", "... checking chunks", r["verify_s"]),
        c("shared_resume_restore_seconds_total", "... applying it to a slot", r["restore_s"]),
        c("shared_resume_prefill_seconds_total", "... prefilling their turn", r["prefill_s"]),
        c("shared_reprefilled_tokens_total", "Tokens prefilled again", r["n_reprefilled_tokens"]),
        c("shared_forwarded_total", "Turns forwarded to their owner", r["n_forwarded"]),
        c("shared_forward_failed_total", "Forwards whose owner gave no answer",
          r["n_forward_failed"]),
        c("shared_unavailable_total", "Turns answered 503 (owner or tier away)",
          r["n_unavailable"]),
        c("shared_handoffs_total", "Minds handed off to another replica", w["n_handoffs"]),
        c("shared_minds_lost_total", "Minds lost to another replica", w["n_lost"]),
        c("shared_unreachable_total", "Operations that found Redis away", view.n_unreachable),
        g("shared_publish_bytes_per_second", "Mean publication rate",
          _rate(store.bytes_written, store.publish_s)),
        g("shared_fetch_bytes_per_second", "Mean fetch rate",
          _rate(store.bytes_read, store.fetch_s)),
        g("shared_leases_held", "Minds whose lease this replica holds", len(view.held)),
        g("shared_dirty_minds", "Held minds with unpublished state",
          sum(h.dirty for h in view.held)),
        g("shared_unpublished_tokens", "Tokens not yet published, all held minds",
          sum(h.n_unpublished for h in view.held)),
        g("shared_tier_bytes", "Page bytes in the tier (its budget's count)",
          view.tier_bytes or 0),
        g("shared_redis_used_bytes", "Redis's memory", view.redis_used_bytes or 0),
    ]  # fmt: skip
