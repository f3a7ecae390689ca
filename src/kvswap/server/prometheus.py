"""/metrics: Prometheus text written by kvswap itself, in llama-server's style.

Every name carries the `llamacpp:` prefix, counters and gauges each with HELP and TYPE lines, no
`_created` series. The throughput gauges are rates since the previous read of /metrics, as
llama-server's buckets; `MetricsRenderer` keeps the previous reading (it is the only state).
llama-server's own series are tables (`LLAMA_COUNTERS`, `LLAMA_GAUGES`), as kvswap's are
(`KVSWAP_SERIES`). In the shell: /metrics (`llama/`) and the shared tier's series
(`formats_cluster`) both write with it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from kvswap.engine.metrics import MetricsSnapshot
from kvswap.minds.chains import ChainCounters

PREFIX = "llamacpp:"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "counter" | "gauge"
    help: str
    value: float


def _fmt(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(metrics: list[Metric]) -> str:
    lines = []
    for m in metrics:
        lines.append(f"# HELP {PREFIX}{m.name} {m.help}")
        lines.append(f"# TYPE {PREFIX}{m.name} {m.kind}")
        lines.append(f"{PREFIX}{m.name} {_fmt(m.value)}")
    return "\n".join(lines) + "\n"


# kvswap's own series: name -> (kind, help). Values come from MetricsSnapshot.extra.
KVSWAP_SERIES: dict[str, tuple[str, str]] = {
    "page_store_bytes": ("gauge", "Bytes held by the page store"),
    "page_store_pages": ("gauge", "Pages held by the page store"),
    "page_spill_held_bytes": ("gauge", "Bytes of pages held only by running spills"),
    "page_store_leaked_bytes": (
        "gauge",
        "Bytes of page buffers that could not be unmapped (still charged; stays 0)",
    ),
    "page_store_spare_bytes": ("gauge", "Bytes reserved for buffers prepared ahead"),
    "ctx_checkpoint_bytes": ("gauge", "Bytes held by context checkpoints in slots"),
    "page_out_total": ("counter", "Successful page_out operations"),
    "page_in_total": ("counter", "Successful page_in operations"),
    "page_failed_total": ("counter", "Page operations that failed"),
    "ctx_checkpoints_evicted_budget_total": (
        "counter",
        "Checkpoints evicted to stay under the byte budget",
    ),
    "ctx_checkpoints_skipped_budget_total": (
        "counter",
        "Checkpoints skipped because the byte budget was full",
    ),
    "reconfigure_total": ("counter", "Successful live reconfigures"),
    "reconfigure_failed_total": ("counter", "Live reconfigures refused or rolled back"),
    "mind_hits_slot_total": ("counter", "Mind requests that found their mind in a slot"),
    "mind_hits_ram_total": ("counter", "Mind requests that paged their mind in from RAM"),
    "mind_hits_disk_total": (
        "counter",
        "Mind requests that read their mind back from disk or the shared tier",
    ),
    "mind_new_total": ("counter", "Mind requests that started a new mind"),
    "mind_disk_seeds_total": (
        "counter",
        "New minds started from a prefix their tenant's mind on disk held",
    ),
    "mind_demotions_total": ("counter", "Minds paged out of a slot into RAM"),
    "mind_spills_total": ("counter", "Mind pages spilled from RAM to disk"),
    "mind_spill_failed_total": ("counter", "Mind spills that failed"),
    "mind_disk_refused_total": ("counter", "Mind spills refused: --page-disk-bytes full"),
    "mind_disk_dropped_total": ("counter", "Spilled minds dropped (--page-disk-drop-lru)"),
    "mind_flushes_total": (
        "counter",
        "Idle minds written to disk on schedule (--page-flush-seconds)",
    ),
    "mind_too_large_total": (
        "counter",
        "Minds larger than the whole page store that left their slot (spilled, or dropped)",
    ),
    "mind_diverged_total": (
        "counter",
        "Mind requests whose prompt did not extend their mind's history (the rest was dropped)",
    ),
    "mind_dropped_tokens_total": (
        "counter",
        "Tokens of minds' histories dropped by requests that diverged from them",
    ),
    "mind_entries": ("gauge", "Minds the registry keeps an entry for (those that hold state)"),
    "mind_switch_ms_total": (
        "counter",
        "Engine milliseconds spent moving minds in and out of slots",
    ),
    "mind_seat_wait_ms_total": (
        "counter",
        "Milliseconds requests waited for room to start: a page buffer being mapped, the "
        "demoter's room for a switch, a mind's hand-off to disk",
    ),
    "mind_read_ms_total": (
        "counter",
        "Milliseconds spent reading minds back from disk (read and verify, off the engine)",
    ),
    "mind_read_bytes_total": ("counter", "Bytes of minds read back from disk"),
    "mind_restore_ms_total": (
        "counter",
        "Engine milliseconds spent applying minds read back to their slots",
    ),
    "anon_cache_bytes": ("gauge", "Bytes of anonymous prompt states cached in RAM"),
    "anon_cache_entries": ("gauge", "Anonymous prompt states cached in RAM"),
    "anon_cache_saved_total": ("counter", "Anonymous prompt states saved to the cache"),
    "anon_cache_hits_total": ("counter", "Anonymous requests that took a cached prefix"),
    "anon_cache_skipped_total": (
        "counter",
        "Anonymous cache saves skipped: no prepared buffer was ready",
    ),
    "mind_seeds_total": (
        "counter",
        "New minds that started from the longest prefix another mind of their tenant held in RAM",
    ),
}


# llama-server's own series, in its order: name -> help. Each value is the snapshot's field of
# the same name, but the two throughput gauges (`_RATES`), rates since the previous read.
LLAMA_COUNTERS: dict[str, str] = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache",
    "prompt_seconds_total": "Total time spent processing prompts",
    "tokens_predicted_total": "Number of generation tokens processed",
    "tokens_predicted_seconds_total": "Total time spent generating tokens",
    "n_decode_total": (
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal "
        "decoding"
    ),
    "n_tokens_max": "Largest observed sequence length (prompt + generation)",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": (
        "Speculative: Total draft tokens accepted by the target model"
    ),
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
}
LLAMA_GAUGES: dict[str, str] = {
    "prompt_tokens_seconds": "Average prompt throughput in tokens/s",
    "predicted_tokens_seconds": "Average generation throughput in tokens/s",
    "requests_processing": "Number of requests processing",
    "requests_deferred": "Number of requests deferred",
    "n_busy_slots_per_decode": "Average number of busy slots per llama_decode() call",
}
# A rate gauge -> (the counter of its quantity, the counter of its seconds).
_RATES = {
    "prompt_tokens_seconds": ("prompt_tokens_total", "prompt_seconds_total"),
    "predicted_tokens_seconds": ("tokens_predicted_steps_total", "tokens_predicted_seconds_total"),
}


def _rate(s: MetricsSnapshot, prev: MetricsSnapshot, quantity: str, seconds: str) -> float:
    d_s = getattr(s, seconds) - getattr(prev, seconds)
    return (getattr(s, quantity) - getattr(prev, quantity)) / d_s if d_s > 0 else 0.0


class MetricsRenderer:
    """Turns engine snapshots into /metrics text, with rates since the previous read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prev = MetricsSnapshot()

    def render(self, s: MetricsSnapshot) -> str:
        with self._lock:
            prev, self._prev = self._prev, s
        counters = [Metric(n, "counter", h, getattr(s, n)) for n, h in LLAMA_COUNTERS.items()]
        gauges = [
            Metric(n, "gauge", h, _rate(s, prev, *_RATES[n]) if n in _RATES else getattr(s, n))
            for n, h in LLAMA_GAUGES.items()
        ]
        own = [
            Metric(name, kind, help_text, s.extra.get(name, 0.0))
            for name, (kind, help_text) in KVSWAP_SERIES.items()
        ]
        return render(
            [
                *counters,
                *[m for m in own if m.kind == "counter"],
                *gauges,
                *[m for m in own if m.kind == "gauge"],
            ]
        )


def stored_metrics(counters: ChainCounters) -> list[Metric]:
    """The stored conversations' series: how each stored turn's prompt was made (a template
    that breaks incremental continuation shows as `rendered`), forks, minds let go."""
    turns = counters.turns
    return [
        Metric(
            f"responses_{mode.value}_total",
            "counter",
            f"Stored Responses turns whose prompt was {_MODE_HELP[mode.value]}",
            turns[mode],
        )
        for mode in turns
    ] + [
        Metric(
            "responses_forks_total",
            "counter",
            "Stored turns forked into a new mind",
            counters.n_forks,
        ),
        Metric(
            "responses_minds_released_total",
            "counter",
            "Minds no stored response or conversation references any more",
            counters.n_released,
        ),
    ]


_MODE_HELP = {
    "new": "a new chain's render",
    "incremental": "the mind's own tokens plus the rendered glue",
    "kept": "the mind's own tokens plus the glue, its last answer kept as generated",
    "rendered": "the whole render tokenized (incremental continuation not possible)",
    "truncated": "rendered after dropping the oldest items (truncation: auto)",
}
