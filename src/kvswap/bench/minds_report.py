"""The tables and the plot of `kvswap bench minds`: one row per case and server, then the
ratios llama-server / kvswap per case (what the bench is for), then the parts of kvswap's later
turns against their floor. Pure formatting."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvswap.bench.minds_script import Case, Result, Turn

Rows = Sequence[tuple[Case, Mapping[str, Result], str]]


def _est(r: Result) -> str:
    return " (est.)" if r.estimated else ""


def table_lines(results: Rows) -> list[str]:
    lines = [
        "| case | server | total s | first round s | later turn p50 s | switching s "
        "| re-prefill s (tokens) | restart s | tokens prefilled | TTFT p50 ms | TTFT p95 ms "
        "| text as kvswap | notes | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, by_server, load in results:
        ref = by_server["kvswap"]
        for side, r in by_server.items():
            diff = r.first_difference(ref)
            same = "yes" if not diff else f"NO ({diff})"
            restart = f"{r.restart_s:.2f}" if case.restart is not None else "-"
            lines.append(
                f"| {case.name} | {side}{_est(r)} | {r.total_s:.1f} | {r.first_round_s:.1f} "
                f"| {r.later_p50_s():.3f} | {r.switch_s:.3f} | {r.lost_s:.3f} ({r.n_lost}) "
                f"| {restart} | {r.n_prefilled} | {r.ttft(0.5):.0f} | {r.ttft(0.95):.0f} "
                f"| {same if side != 'kvswap' else '-'} | {'; '.join(r.notes)} | {load} |"
            )
    return lines


def _ratio(theirs: float, ours: float) -> str:
    if ours <= 0:
        return "-" if theirs <= 0 else "inf"
    return f"{theirs / ours:.2f}x"


def ratio_lines(results: Rows) -> list[str]:
    """llama-server's figure over kvswap's: above 1, kvswap is faster."""
    lines = [
        "| case | first round | later turn p50 | switching | re-prefill | TTFT p50 | total |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, by_server, _ in results:
        if "llama-server" not in by_server:
            continue
        k, ls = by_server["kvswap"], by_server["llama-server"]
        lines.append(
            f"| {case.name}{_est(ls)} | {_ratio(ls.first_round_s, k.first_round_s)} "
            f"| {_ratio(ls.later_p50_s(), k.later_p50_s())} | {_ratio(ls.switch_s, k.switch_s)} "
            f"| {_ratio(ls.lost_s, k.lost_s)} | {_ratio(ls.ttft(0.5), k.ttft(0.5))} "
            f"| {_ratio(ls.total_s, k.total_s)} |"
        )
    return lines


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def parts_lines(results: Rows) -> list[str]:
    """kvswap's later turns (every kvswap side: this tree, and a baseline's): p50 of the turn,
    its TTFT and prefill; for the turns that read their mind back from disk, p50 of the read,
    the restore and the read's floor (the file from the page cache into a buffer already in
    memory), and (read + restore) over (floor + restore)."""
    lines = [
        "| case | server | later turn p50 ms | TTFT p50 ms | prefill p50 ms | turns from disk "
        "| read p50 ms | restore p50 ms | floor read p50 ms | read + restore vs floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, by_server, _ in results:
        for side, r in by_server.items():
            if side == "llama-server":
                continue
            later = r.rounds(1)
            disk: list[Turn] = [t for t in later if t.read_ms > 0]
            floored = [t for t in disk if t.floor_read_ms > 0]
            vs_floor = "-"
            if floored:
                spent = statistics.median(t.read_ms + t.restore_ms for t in floored)
                floor = statistics.median(t.floor_read_ms + t.restore_ms for t in floored)
                vs_floor = f"{spent / floor:.2f}x"
            lines.append(
                f"| {case.name} | {side} | {_p50([t.wall_ms for t in later])} "
                f"| {_p50([t.ttft_ms for t in later])} | {_p50([t.prompt_ms for t in later])} "
                f"| {len(disk)} of {len(later)} | {_p50([t.read_ms for t in disk])} "
                f"| {_p50([t.restore_ms for t in disk])} "
                f"| {_p50([t.floor_read_ms for t in floored])} | {vs_floor} |"
            )
    return lines


def plot(results: Rows, path: Path) -> None:
    """Switching time and TTFT p50 per case, both servers side by side (log scales)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [case.name for case, _, _ in results]
    sides = sorted({side for _, by, _ in results for side in by}, key=lambda s: s != "kvswap")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(1, len(sides))
    for j, side in enumerate(sides):
        xs = [i + (j - (len(sides) - 1) / 2) * width for i in range(len(results))]
        switch = [max(by[side].switch_s, 1e-3) if side in by else 0 for _, by, _ in results]
        ttft = [max(by[side].ttft(0.5), 1e-1) if side in by else 0 for _, by, _ in results]
        ax1.bar(xs, switch, width=width, label=side)
        ax2.bar(xs, ttft, width=width, label=side)
    for ax, title, unit in (
        (ax1, "time switching (rounds after the first)", "s"),
        (ax2, "time to first token, p50 (rounds after the first)", "ms"),
    ):
        ax.set_xticks(range(len(results)), names)
        ax.set_yscale("log")
        ax.set_ylabel(f"{unit}, log scale")
        ax.set_title(title)
        ax.legend()
    fig.suptitle("kvswap bench minds: the same script on both servers, same RAM budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):,.0f}"


def memory_lines(results: Rows) -> list[str]:
    """Each server's peak RSS beside what its flags mean it to hold (weights + KV pool + RAM
    budget), and the difference; then its anonymous part's peak (sampled every 20 ms) beside
    what it held with one mind resident (the KV pool and compute buffers in use, the runtime)
    + the budget, and its file-backed part's (the weights, a mind's file mapped while it is
    restored: page cache the kernel may drop)."""
    lines = [
        "| case | server | peak RSS MiB | weights + KV pool + budget MiB | over MiB "
        "| peak anonymous MiB | anonymous with one mind + budget MiB | anonymous over MiB "
        "| peak file-backed MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, by_server, _ in results:
        for side, r in by_server.items():
            over = r.peak_rss_bytes - r.rss_bound_bytes
            anon_over = r.peak_anon_bytes - r.anon_bound_bytes
            lines.append(
                f"| {case.name} | {side} | {_mib(r.peak_rss_bytes)} "
                f"| {_mib(r.rss_bound_bytes)} | {_mib(over)} | {_mib(r.peak_anon_bytes)} "
                f"| {_mib(r.anon_bound_bytes)} | {_mib(anon_over)} | {_mib(r.peak_file_bytes)} |"
            )
    return lines
