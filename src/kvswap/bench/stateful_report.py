"""`kvswap bench stateful`'s report: per turn and way, TTFT p50/p95, request bytes, server CPU,
the server's prefill, mind moves, waits for room and tokens prefilled; the targets (the stored
path's last turn within 1.2x of its turn 2, request bytes that do not grow with the chain, never
slower than a full re-send, at least 10x faster than llama-server over the RAM budget), each
with its figure; the
plot of TTFT per turn (`bench-stateful.png`, with matplotlib); and the stored turn against its
floor, the same turn on a mind resident in its slot (the `kvswap resident` way, when run: within
1.15x), paired: each agent's stored turn over the same agent's resident turn, played beside it
(`bench.stateful`). Owns the figures a turn records (`TurnFigures`) and the ways' names. Written
to stdout and `--out`/bench-stateful.md."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

WAYS = ("kvswap stored", "kvswap re-send", "llama-server re-send", "kvswap resident")


@dataclass(frozen=True)
class TurnFigures:
    way: str
    agent: int
    turn: int
    ttft_ms: float
    total_ms: float
    request_bytes: int
    cpu_ms: float
    n_prompt: int  # the prompt's tokens
    n_prefilled: int  # ... of them, those the server computed
    moved_ms: float = 0.0  # kvswap: the server's mind moves for it (switch, read, restore)
    wait_ms: float = 0.0  # kvswap: its wait for room to start (a buffer, the demoter's room)
    prefill_ms: float = 0.0  # kvswap: the engine's prompt processing while it ran
    error: str = ""


ByWay = dict[str, list[TurnFigures]]


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _at(figures: list[TurnFigures], turn: int) -> list[TurnFigures]:
    return [f for f in figures if f.turn == turn and not f.error]


def _ttft(figures: list[TurnFigures], turn: int, q: float = 0.5) -> float:
    return _q([f.ttft_ms for f in _at(figures, turn)], q)


def table(figures: ByWay, turns: list[int]) -> list[str]:
    lines = [
        "| turn | way | TTFT p50 ms | TTFT p95 ms | request KB | server CPU ms | prefill ms "
        "| mind moves ms | waits ms | prompt tokens | prefilled |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for turn in turns:
        for way, figs in figures.items():
            at = _at(figs, turn)
            if not at:
                continue
            kb = statistics.mean(f.request_bytes for f in at) / 1024
            cpu = statistics.mean(f.cpu_ms for f in at)
            moved = statistics.mean(f.moved_ms for f in at)
            waited = statistics.mean(f.wait_ms for f in at)
            prefill = statistics.mean(f.prefill_ms for f in at)
            n_prompt = statistics.mean(f.n_prompt for f in at)
            n_pre = statistics.mean(f.n_prefilled for f in at)
            lines.append(
                f"| {turn + 1} | {way} | {_ttft(figs, turn):.0f} | {_ttft(figs, turn, 0.95):.0f} "
                f"| {kb:.1f} | {cpu:.0f} | {prefill:.0f} | {moved:.0f} | {waited:.0f} "
                f"| {n_prompt:.0f} | {n_pre:.0f} |"
            )
    return lines


def targets(figures: ByWay, n_turns: int) -> list[str]:
    """Each target with its figure (the last turn against turn 2, and the other ways)."""
    stored = figures.get(WAYS[0], [])
    last = n_turns - 1
    out = []
    if stored and n_turns >= 2:
        ratio = _ttft(stored, last) / max(_ttft(stored, 1), 1e-9)
        out.append(f"- stored: turn {n_turns} TTFT p50 / turn 2: {ratio:.2f}x (target <= 1.2x)")
        grow = statistics.mean(f.request_bytes for f in _at(stored, last)) / max(
            1.0, statistics.mean(f.request_bytes for f in _at(stored, 1))
        )
        out.append(f"- stored: request bytes turn {n_turns} / turn 2: {grow:.2f}x (target ~1x)")
    resend = figures.get(WAYS[1], [])
    if stored and resend:
        slower = [t + 1 for t in range(1, n_turns) if _ttft(stored, t) > _ttft(resend, t)]
        out.append(
            "- stored vs kvswap re-send: TTFT p50 slower on turns "
            f"{slower or 'none'} (target: none); turn {n_turns}: "
            f"{_ttft(resend, last) / max(_ttft(stored, last), 1e-9):.2f}x faster"
        )
    llama = figures.get(WAYS[2], [])
    if stored and llama:
        speedup = _ttft(llama, last) / max(_ttft(stored, last), 1e-9)
        out.append(f"- stored vs llama-server re-send: turn {n_turns} TTFT p50 {speedup:.1f}x "
                   "faster (target >= 10x over the RAM budget)")  # fmt: skip
    resident = figures.get(WAYS[3], [])
    if stored and resident and n_turns >= 2:
        out += floor_lines(stored, resident, n_turns)
    failed = [f for figs in figures.values() for f in figs if f.error]
    if failed:
        out.append(f"- {len(failed)} failed turns; first: {failed[0].way}: {failed[0].error}")
    return out


def _paired(stored: list[TurnFigures], resident: list[TurnFigures], turn: int) -> float:
    """The median over agents of a stored turn's TTFT over the same agent's turn resident in
    its slot, played beside it (0 when no agent answered both)."""
    floor = {f.agent: f.ttft_ms for f in _at(resident, turn)}
    return _q([f.ttft_ms / floor[f.agent] for f in _at(stored, turn) if floor.get(f.agent)], 0.5)


def floor_lines(stored: list[TurnFigures], resident: list[TurnFigures], n_turns: int) -> list[str]:
    """The stored turn against its floor, each agent's turn against the same turn resident in
    its slot, and what of a stored turn the server spent moving its mind."""
    ratios = {t + 1: _paired(stored, resident, t) for t in range(1, n_turns)}
    worst = max(ratios, key=lambda t: ratios[t])
    moved = {t: _q([f.moved_ms for f in _at(stored, t)], 0.5) for t in range(n_turns)}
    most = max(moved, key=lambda t: moved[t])
    return [
        f"- stored vs the same turn on a mind resident in its slot (its floor; the median of "
        f"each agent's ratio): TTFT {ratios[worst]:.2f}x at worst (turn {worst}), "
        f"{ratios[n_turns]:.2f}x at turn {n_turns} (target <= 1.15x at every turn)",
        f"- stored: the server's moves of the turn's mind (switch out and in, read from disk, "
        f"restore) p50 {moved[most]:.0f} ms at most (turn {most + 1}, TTFT p50 "
        f"{_ttft(stored, most):.0f} ms)",
    ]


def plot(figures: ByWay, n_turns: int, path: Path, title: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no plot: matplotlib is not installed; `pip install kvswap[bench]`)"
    fig, ax = plt.subplots(figsize=(7, 4))
    turns = list(range(n_turns))
    for way, figs in figures.items():
        played = [t for t in turns if _at(figs, t)]  # llama-server may join late
        ax.plot([t + 1 for t in played], [_ttft(figs, t) for t in played], marker="o", label=way)
    ax.set_yscale("log")
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT p50 (ms, log)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![TTFT per turn]({path.name})"


def report(a: argparse.Namespace, argv: list[str], figures: ByWay) -> int:
    title = (
        f"{a.agents} agents x {a.turns} turns, ~{a.message_tokens}-token messages, "
        f"{a.n_predict} tokens a turn, -np {a.slots} x {a.ctx_slot}, "
        f"{a.page_ram_mib} MiB RAM budget, -t {a.threads}"
    )
    joined = a.llama_server_from - 1  # llama-server's first turn when it joins late
    picked = sorted({0, 1, a.turns // 4, a.turns // 2, (3 * a.turns) // 4, joined, a.turns - 1})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# kvswap bench stateful: {title}", "", f"command: `kvswap bench stateful "
             f"{' '.join(argv)}`", ""]  # fmt: skip
    lines += table(figures, [t for t in picked if 0 <= t < a.turns])
    lines += ["", *targets(figures, a.turns), ""]
    lines.append(plot(figures, a.turns, out / "bench-stateful.png", title))
    (out / "bench-stateful.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not any(f.error for figs in figures.values() for f in figs) else 1
