"""`kvswap bench minds`: the cases a user of many minds meets, kvswap beside llama-server.

Each case runs the same script (`minds_script.Script`) on kvswap (requests name their mind:
`"mind": NAME`) and, with `--llama-server BIN`, on that llama-server with the same flags and
the same RAM budget (`--cache-ram` MiB for it, `--page-ram-bytes` for kvswap), alternating
which server goes first from case to case:

- `fit`: every mind fits in the RAM budget;
- `exceed`: the minds need about `--exceed` times the budget (the working set outside the slots
  cannot stay in RAM: llama-server re-prefills, kvswap spills to disk and reads back);
- `restart-term`, `restart-kill`: the fitting workload, with the server restarted after the
  first round by SIGTERM or SIGKILL (kvswap resumes its minds from `--slot-save-path`;
  llama-server re-prefills). Before a SIGKILL both servers have been idle until kvswap's
  `/pages` showed every mind written to disk (its write-behind after a quiet second);
- `long`: few long minds (8k tokens and more) exceeding the budget on one slot, on a generated
  model with SmolLM2's KV bytes per token (`--long-model` to change). llama-server's later
  rounds there are run when they would take under `--real-limit-s`, else estimated from the
  prefill rate it measured in the first round, and marked "est.".

Per case and server: total time, first-round time, later-turn p50, time switching (rounds after
the first: state moves plus re-prefill of tokens a mind already had), the re-prefill alone,
tokens prefilled, TTFT p50/p95, and whether the text matches kvswap's turn for turn. Every
figure is printed with the `uptime` load of its moment; `--runs N` repeats each case and keeps
the median run (by total time).

`--baseline-src DIR` also runs another checkout of kvswap (its `src/` on PYTHONPATH, this
virtual environment), taking turns with this one, so a before/after of the same case shares the
machine's load. For kvswap's later turns a second table splits a switch from disk into its
parts (the read, the restore, the prefill) beside the floor of the first two: the mind's file
read from the page cache into a buffer already in memory, plus the restore; with `--cold`,
each later turn's mind file leaves the page cache first (`posix_fadvise(DONTNEED)`), and the
floor reads it from the disk too.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvswap.bench.minds_report import memory_lines, parts_lines, plot, ratio_lines, table_lines
from kvswap.bench.minds_script import (
    Case,
    Result,
    Script,
    estimate,
    kvswap_probe,
    llama_probe,
)
from kvswap.bench.server import BenchServer, peak_rss_bytes
from kvswap.bench.switch_floors import drop_cache
from kvswap.models import default_model_path

_GROWTH = 30  # tokens a turn adds to a mind, about (estimates only)
BASELINE = "kvswap baseline"  # the side of --baseline-src
_WRITE_BEHIND_WAIT_S = 120.0


def uptime() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def kv_bytes_per_token(model: str) -> int:
    """f16 KV bytes per token of a GGUF (2 * n_layer * n_embd_kv * 2), from its metadata."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")

    def value(key: str) -> int:
        return int(reader.fields[f"{arch}.{key}"].parts[-1][0])

    n_head, n_embd = value("attention.head_count"), value("embedding_length")
    head_dim = (
        value("attention.key_length")
        if f"{arch}.attention.key_length" in reader.fields
        else n_embd // n_head
    )
    return 2 * value("block_count") * value("attention.head_count_kv") * head_dim * 2


def _common_args(case: Case, a: argparse.Namespace) -> list[str]:
    n_ctx_slot = case.n_tokens + case.rounds * (a.n_predict + 60) + 512
    return [
        "-m", case.model, "-c", str(case.n_slots * n_ctx_slot), "-np", str(case.n_slots),
        "-t", str(a.threads), "-tb", str(a.threads),
    ]  # fmt: skip


def _wait_written_behind(server: BenchServer, n_minds: int) -> float:
    """Seconds until kvswap's /pages shows every mind's newest state on disk."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + _WRITE_BEHIND_WAIT_S
    while time.monotonic() < deadline:
        minds = server.client.get("/pages").json().get("minds", [])
        current = [m for m in minds if m.get("n_tokens_on_disk") == m["n_tokens"]]
        if len(current) >= n_minds:
            break
        time.sleep(0.1)
    return time.perf_counter() - t0


def mind_file(save: Path, mind: str) -> Path | None:
    """Mind `mind`'s newest file under the save path (None: none yet)."""
    suffix = "~" + mind.encode("utf-8").hex()
    # The minds' folder (this tree), or the save path itself (older trees); never a stage.
    homes = (save, save / ".kvswap-minds")
    files = [p for p in save.rglob(f"*{suffix}") if p.is_file() and p.parent in homes]
    return max(files, key=lambda p: p.stat().st_mtime_ns) if files else None


def drop_cached(save: Path, mind: str) -> None:
    """Mind `mind`'s file leaves the page cache (`posix_fadvise(DONTNEED)`; its pages are
    clean once written and fsynced): its next read is from the disk."""
    path = mind_file(save, mind)
    if path is not None:
        drop_cache(path)


def read_floor_ms(save: Path, mind: str, *, cold: bool = False) -> float:
    """The floor of reading mind `mind` back (ms): its newest file read into a buffer already
    in memory (no checksum, no page faults), from the page cache, or from the disk when `cold`;
    0 when none is found."""
    path = mind_file(save, mind)
    if path is None:
        return 0.0
    if cold:
        drop_cached(save, mind)
    size = path.stat().st_size
    view = memoryview(bytearray(size))  # zeroed, so every page is in memory before the read
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size and (n := f.readinto(view[got:])):
            got += n
    return (time.perf_counter() - t0) * 1e3


def run_case(case: Case, a: argparse.Namespace, side: str) -> Result:
    """One case on one server: "kvswap", "kvswap baseline" (`--baseline-src`) or
    "llama-server"."""
    kvswap = side != "llama-server"
    label = f"{case.name} {side}"
    script = Script(case.n_minds, case.n_tokens, a.n_predict, label)
    result = Result(case.name, side)
    with tempfile.TemporaryDirectory(prefix="kvswap-bench-minds-") as save:
        args = _common_args(case, a)
        if kvswap:
            args += ["--cache-ram", "0", "--page-ram-bytes", str(case.budget_bytes),
                     "--slot-save-path", save, "--metrics"]  # fmt: skip
        else:
            args += ["--cache-ram", str(max(1, case.budget_bytes >> 20)), "-lv", "4"]
        binary = None if kvswap else a.llama_server
        env = dict(os.environ)
        if side == BASELINE:
            env["PYTHONPATH"] = str(Path(a.baseline_src) / "src")
        extra: Callable[[int], dict[str, Any]] = (
            (lambda m: {"mind": f"mind-{m}"}) if kvswap else (lambda m: {})
        )
        probe_of = kvswap_probe if kvswap else llama_probe
        floor, before = None, None
        if kvswap:
            floor = lambda m: read_floor_ms(Path(save), f"mind-{m}", cold=a.cold)  # noqa: E731
            if a.cold:
                before = lambda m: drop_cached(Path(save), f"mind-{m}")  # noqa: E731
        server = BenchServer(args, binary=binary, env=env)
        try:
            script.fit_to(server)
            t0 = time.perf_counter()
            in_use: list[int] = []  # anonymous memory once the first mind is resident
            result.turns = script.play(
                server, probe_of(server), range(1), extra, before=_first_resident(server, in_use)
            )
            if case.restart is not None:
                if case.restart == signal.SIGKILL:
                    waited = _wait_written_behind(server, case.n_minds) if kvswap else 1.0
                    result.notes.append(f"killed after {waited:.1f} s idle")
                server.stop(case.restart)
                server = BenchServer(args, binary=binary, env=env)
                result.restart_s = server.ready_s
            later = range(1, case.rounds)
            if not kvswap and _would_take_s(result, case) > case.real_limit_s:
                result.turns += estimate(result.turns, later, case.n_minds, _GROWTH)
                result.notes.append("later rounds estimated from its measured prefill rate")
                result.total_s = sum(t.wall_ms for t in result.turns) / 1e3
            else:
                result.turns += script.play(server, probe_of(server), later, extra, floor, before)
                result.total_s = time.perf_counter() - t0
        finally:
            result.peak_rss_bytes = peak_rss_bytes(server.proc.pid)
            server.stop()
            _memory(result, server, case, in_use)
    result.rss_bound_bytes = _rss_bound(case, args)
    return result


def _first_resident(server: BenchServer, in_use: list[int]) -> Callable[[int], None]:
    """Before the second mind's first turn: the server's anonymous memory with the first mind
    resident (the KV pool and the compute buffers in use, no page yet), into `in_use`."""

    def before(m: int) -> None:
        if m == 1 and not in_use:
            in_use.append(server.rss.now()[0])

    return before


def _memory(result: Result, server: BenchServer, case: Case, in_use: list[int]) -> None:
    """The server's memory peaks, and what its anonymous memory is meant to stay near: what it
    held with the first mind resident (at start, for a restarted server) + the RAM budget; a
    peak over that by more than a small margin is a copy of a mind nothing charged."""
    result.peak_anon_bytes = server.rss.anon_bytes
    result.peak_file_bytes = server.rss.file_bytes
    held = in_use[0] if in_use and case.restart is None else server.anon_at_ready_bytes
    result.anon_bound_bytes = held + case.budget_bytes


def _rss_bound(case: Case, args: list[str]) -> int:
    """Weights (the model file) + the KV pool (`-c` cells at f16) + the RAM budget: the memory
    a server of these flags is meant to hold."""
    n_ctx = int(args[args.index("-c") + 1])
    weights = Path(case.model).stat().st_size
    return weights + kv_bytes_per_token(case.model) * n_ctx + case.budget_bytes


def _would_take_s(first_round: Result, case: Case) -> float:
    """Later rounds' time if every turn re-prefills its mind at the first round's rate."""
    turns = first_round.rounds(0, 0)
    return sum(t.ttft_ms for t in turns) / 1e3 * (case.rounds - 1)


def cases(a: argparse.Namespace) -> list[Case]:
    model = a.model or str(default_model_path())
    per_mind = kv_bytes_per_token(model) * (a.tokens + 50 + a.rounds * _GROWTH)
    total = per_mind * a.minds
    base = Case("fit", model, a.minds, a.tokens, a.slots, a.rounds, budget_bytes=4 * total)
    # A page must fit the store beside the switch's spare buffer: at least 2.5 minds.
    exceed = max(int(total / a.exceed), int(2.5 * per_mind))
    out = {
        "fit": base,
        "exceed": replace(base, name="exceed", budget_bytes=exceed),
        "restart-term": replace(base, name="restart-term", restart=signal.SIGTERM),
        "restart-kill": replace(base, name="restart-kill", restart=signal.SIGKILL),
    }
    if a.long_tokens:
        long_model = a.long_model or _long_model(a.long_tokens)
        long_mind = kv_bytes_per_token(long_model) * (a.long_tokens + 50 + 2 * _GROWTH)
        out["long"] = Case(
            "long", long_model, a.long_minds, a.long_tokens, 1, 2,
            budget_bytes=int(2.5 * long_mind), real_limit_s=a.real_limit_s,
        )  # fmt: skip
    return [out[name] for name in a.cases.split(",") if name in out]


def _long_model(n_tokens: int) -> str:
    from kvswap.tiny import realistic_kv_params, tiny_model_path

    params = realistic_kv_params("smollm2-135m")
    params["n_ctx_train"] = max(params["n_ctx_train"], 2 * n_tokens)
    return str(tiny_model_path("llama", **params))


def _median_run(runs: list[Result]) -> Result:
    ordered = sorted(runs, key=lambda r: r.total_s)
    return ordered[len(ordered) // 2]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvswap bench minds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=600, help="tokens of each mind's opening prompt")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--n-predict", type=int, default=8)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the embedded SmolLM2)")
    p.add_argument(
        "--exceed", type=float, default=2.5, help="minds' bytes over the budget (exceed)"
    )
    p.add_argument("--long-tokens", type=int, default=8192, help="tokens of a long mind (0: skip)")
    p.add_argument("--long-minds", type=int, default=4)
    p.add_argument("--long-model", default=None, help="model of the long case (default: generated)")
    p.add_argument("--real-limit-s", type=float, default=120.0,
                   help="llama-server's later long rounds run for real below this, else estimated")  # fmt: skip
    p.add_argument("--cases", default="fit,exceed,restart-term,restart-kill,long")
    p.add_argument("--runs", type=int, default=1, help="runs of each case (median by total time)")
    p.add_argument(
        "--cold",
        action="store_true",
        help="each later turn's mind file leaves the page cache first (and its floor reads cold)",
    )
    p.add_argument("--llama-server", default="", metavar="BIN", help="the pinned llama-server")
    p.add_argument(
        "--baseline-src",
        default="",
        metavar="DIR",
        help="another kvswap checkout, run beside this one (before/after in one sitting)",
    )
    p.add_argument("--out", default="docs", help="folder for bench-minds.png and bench-minds.md")
    return p


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    sides = ["kvswap"] + ([BASELINE] if a.baseline_src else [])
    sides += ["llama-server"] if a.llama_server else []
    results: list[tuple[Case, dict[str, Result], str]] = []
    for i, case in enumerate(cases(a)):
        print(f"# {case.title} ({uptime()})", flush=True)
        order = sides if i % 2 == 0 else sides[::-1]
        runs: dict[str, list[Result]] = {side: [] for side in sides}
        for _ in range(a.runs):
            for side in order:
                runs[side].append(run_case(case, a, side))
        chosen = {side: _median_run(runs[side]) for side in sides}
        load = uptime()
        results.append((case, chosen, load))
        for line in table_lines([(case, chosen, load)]):
            print(line, flush=True)
    lines = [
        f"# kvswap bench minds (`kvswap bench minds {' '.join(argv)}`)",
        "",
        *table_lines(results),
        "",
        *ratio_lines(results),
        "",
        *parts_lines(results),
        "",
        *memory_lines(results),
        "",
    ]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "bench-minds.png")
    lines += ["![bench minds](bench-minds.png)", ""]
    (out / "bench-minds.md").write_text("\n".join(lines))
    print("\n".join(lines))
    identical = all(all(r.identical_to(c["kvswap"]) for r in c.values()) for _, c, _ in results)
    return 0 if identical else 1
