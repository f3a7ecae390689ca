"""`kvswap bench flush`: what a SIGKILL loses, with and without `--page-flush-seconds`.

N minds take one turn each on a server with `--slot-save-path` (more minds than slots: some are
RAM pages, some resident; none under RAM pressure, so nothing else writes them), the server then
idles `--idle` seconds and is killed with SIGKILL. A restart on the same save path answers each
mind's next turn; a mind came back when that turn found its conversation cached. Per flush
setting: minds back, conversation tokens prefilled again, and how long after the last turn every
mind was on disk (from /pages, polled while idle): a SIGKILL after that moment loses nothing.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from dataclasses import dataclass

from kvswap.bench.progress import progress
from kvswap.bench.server import BenchServer
from kvswap.models import default_model_path


@dataclass
class Outcome:
    flush_s: str
    n_back: int
    n_lost_tokens: int
    all_on_disk_s: float | None  # after the last turn; None: not within the idle time


def _prompt(m: int, n_tokens: int) -> str:
    facts = " ".join(
        f"Fact {j} of mind {m}: door {j} is {j % 5} steps away." for j in range(n_tokens // 16)
    )
    return f"<|im_start|>system\n{facts}<|im_end|>\n<|im_start|>user\nWhich door?<|im_end|>\n<|im_start|>assistant\n"


def run(a: argparse.Namespace, flush_s: str) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="kvswap-bench-flush-") as save:
        args = ["-m", a.model, "-c", str(a.ctx), "-np", str(a.slots), "-t", str(a.threads),
                "--slot-save-path", save, "--page-flush-seconds", flush_s]  # fmt: skip
        n_prompt: dict[int, int] = {}
        with BenchServer(args) as server:
            for m in range(a.minds):
                progress(f"flush {flush_s}", m, a.minds, "turns")
                body = {"prompt": _prompt(m, a.tokens), "n_predict": 4, "temperature": 0}
                out = server.completion({**body, "mind": f"m{m}"})
                n_prompt[m] = out["timings"]["prompt_n"] + out["timings"]["cache_n"]
            progress(f"flush {flush_s}", a.minds, a.minds, "turns")
            t_last = time.monotonic()
            all_on_disk: float | None = None
            while time.monotonic() < t_last + a.idle:
                minds = server.client.get("/pages").json()["minds"]
                if all_on_disk is None and minds and all(v["on_disk"] for v in minds):
                    all_on_disk = time.monotonic() - t_last
                time.sleep(0.1)
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()
        n_back, n_lost = 0, 0
        with BenchServer(args) as again:
            for m in range(a.minds):
                body = {"prompt": _prompt(m, a.tokens), "n_predict": 4, "temperature": 0}
                out = again.completion({**body, "mind": f"m{m}"})
                cached = out["timings"]["cache_n"]
                n_back += cached >= n_prompt[m] - 1
                n_lost += max(0, n_prompt[m] - 1 - cached)
        return Outcome(flush_s, n_back, n_lost, all_on_disk)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvswap bench flush",
        description="What a SIGKILL loses, with and without --page-flush-seconds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--minds", type=int, default=6, help="minds, one turn each")
    p.add_argument("--tokens", type=int, default=600, help="tokens of each mind's prompt")
    p.add_argument("--slots", type=int, default=2, help="-np of the server")
    p.add_argument("--ctx", type=int, default=2048, help="-c of the server")
    p.add_argument("--idle", type=float, default=5.0, help="idle seconds before the SIGKILL")
    p.add_argument("--flush", default="0,2", help="--page-flush-seconds values to compare")
    p.add_argument("-t", "--threads", type=int, default=2, help="-t of the server")
    p.add_argument("-m", "--model", default=str(default_model_path()), help="the GGUF model")
    a = p.parse_args(argv)
    outcomes = [run(a, f) for f in a.flush.split(",")]
    lines = [
        f"# kvswap bench flush: {a.minds} minds of ~{a.tokens} tokens on {a.slots} slots, "
        f"SIGKILL after {a.idle:g} s idle",
        "",
        f"command: `kvswap bench flush {' '.join(argv)}`",
        "",
        "| --page-flush-seconds | minds back after SIGKILL | tokens prefilled again "
        "| every mind on disk, after the last turn |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        window = f"{o.all_on_disk_s:.1f} s" if o.all_on_disk_s is not None else "never"
        lines.append(f"| {o.flush_s} | {o.n_back} of {a.minds} | {o.n_lost_tokens} | {window} |")
    print("\n".join(lines))
    return 0
