"""`kvswap bench cluster`: what the shared tier buys when a mind changes replica.

Starts redis-server and two `kvswap serve` replicas, A and B, joined through the shared tier
with per-turn publication (SmolLM2 by default, one slot each, `-c 8192`), then measures,
client-side, time to first token of a streamed `/completion` turn:

1. Resume against re-prefill, and against its floor, per mind size (1k, 4k and 8k tokens by
   default; 16k with a model trained on more, `--ctx`): A builds the
   mind (its first turn prefills the whole history), hands it off (as it would to the mind's
   ring home), and B, which never saw the mind, takes the next turn (32 new tokens): it fetches
   the page from Redis, checks it, restores it and prefills the new tokens. The same turn is
   then sent to B under a fresh mind name: a forced re-prefill of the whole conversation. Side
   by side in one run, with B's own split of the resume (fetch, verify, restore, prefill) and
   the page's bytes and GB/s; and the resume against its floor (`cluster_floor`: the page at
   the tier's raw bandwidth, the restore, the new tokens' prefill on B). Re-prefills of minds larger than `--measure-max` are estimated
   from the prefill rate measured on the largest measured one, and labelled so.
2. Bytes written per turn: the 4k mind on B, three turns of 32 tokens each: the chunk bytes each
   publication wrote (delta segments) against the page's size.
3. Takeover after kill -9: B, holding the 4k mind (published), is killed; the next turn goes
   to A: the time from the kill to its first token (A waits out B's lease, then resumes).
4. A forwarded turn, per chat size (`--forward-sizes`): A holds a mind (a chat conversation of
   about that many tokens); its next turn (a streamed /v1/chat/completions) is sent to B, which
   forwards it to A, against the same turn of a twin mind sent to A directly (`--forward-turns`
   pairs; each measured mind paged in from RAM alike). The difference is what forwarding costs
   a turn: B's placement, the hop, and (before the turn was placed first) B's own preparation
   of the body.

Writes a Markdown report and a plot (`--out`). Timing figures on a shared machine are noisy:
the ratios come from one run, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from kvswap.bench.cluster_floor import floor_of, tier_bandwidth
from kvswap.cluster.procs import ManagedProcess, free_port, start_redis
from kvswap.models import default_model_path

TEXT = (
    "The harbour town kept its boats in a long row below the sea wall, and every morning the "
    "fishermen argued about the weather, the price of nets and the old lighthouse keeper who "
    "had seen three storms take the pier. "
)
N_NEW = 32  # tokens a turn adds


@dataclass
class Turn:
    ttft_s: float
    text: str
    cache_n: int
    prompt_n: int
    prompt_ms: float
    tokens: list[int]  # what the mind's KV holds afterwards: prompt (the one token sampled is not)


@dataclass
class SizeResult:
    n_tokens: int
    resume: Turn
    reprefill_s: float
    reprefill_estimated: bool
    identical: bool | None  # None: the re-prefill was estimated
    cold: Turn | None  # the measured re-prefill (None: estimated)
    n_bytes: int
    fetch_s: float
    verify_s: float
    restore_s: float


class Replica:
    def __init__(
        self, name: str, root: Path, redis_url: str, argv: list[str], port: int, peers: str
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        slots = root / name / "slots"
        slots.mkdir(parents=True)
        full = [
            sys.executable, "-m", "kvswap", "serve", *argv, "--port", str(self.port),
            "--slot-save-path", str(slots), "--shared-tier", redis_url, "--replica-id", name,
            "--advertise-url", self.url, "--shared-tier-peers", peers,
            "--shared-tier-rpo-tokens", "0", "--metrics",
        ]  # fmt: skip
        self.proc = ManagedProcess(name, full, root / f"{name}.log")
        self.http = httpx.Client(base_url=self.url, timeout=3600)

    def wait(self) -> None:
        def healthy() -> bool:
            try:
                return self.http.get("/health").status_code == 200
            except httpx.HTTPError:
                return False

        self.proc.wait_for(healthy, 900, "healthy")

    def shared(self) -> dict[str, Any]:
        body: dict[str, Any] = self.http.get("/pages").json()["shared_tier"]
        return body


def turn(replica: Replica, mind: str, prompt: list[int], n_predict: int = 1) -> Turn:
    """A streamed /completion turn of `mind`; TTFT is the first token's arrival."""
    body = {"prompt": prompt, "mind": mind, "n_predict": n_predict, "temperature": 0,
            "stream": True, "cache_prompt": True}  # fmt: skip
    t0 = time.perf_counter()
    ttft, text = 0.0, ""
    timings: dict[str, Any] = {}
    with replica.http.stream("POST", "/completion", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{replica.url}: {r.status_code} {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if not ttft and (event.get("content") or event.get("stop")):
                ttft = time.perf_counter() - t0
            text += event.get("content", "")
            timings = event.get("timings", timings)
    return Turn(ttft, text, timings["cache_n"], timings["prompt_n"], timings["prompt_ms"], prompt)


def chat_turn(replica: Replica, mind: str, messages: list[dict[str, str]]) -> float:
    """A streamed chat turn of `mind` (one token): its time to the first chunk, in seconds."""
    body = {"messages": messages, "max_tokens": 1, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    with replica.http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-Mind-Id": mind}
    ) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{replica.url}: {r.status_code} {r.read().decode()}")
        ttft = 0.0
        for line in r.iter_lines():
            if line.startswith("data: ") and not ttft:
                ttft = time.perf_counter() - t0
    return ttft


def conversation(n_tokens: int, words_per_token: float) -> list[dict[str, str]]:
    """A chat history of about `n_tokens` tokens, in turns of about 256."""
    n_turns = max(1, n_tokens // 256)
    text = " ".join(TEXT.split() * (1 + int(256 * words_per_token) // len(TEXT.split())))
    turn_text = " ".join(text.split()[: int(256 * words_per_token)])
    out: list[dict[str, str]] = []
    for i in range(n_turns):
        out += [
            {"role": "user", "content": f"{i}: {turn_text}"},
            {"role": "assistant", "content": "Noted."},
        ]
    return out


@dataclass
class ForwardResult:
    n_tokens: int  # the conversation's tokens (as rendered by A)
    forwarded_s: list[float]  # each forwarded turn's TTFT
    direct_s: list[float]  # ... and its twin's, sent to the owner directly


def forwarded_turns(a: Replica, b: Replica, n: int, n_pairs: int) -> ForwardResult:
    """Pairs of turns of minds A holds: one sent to B (forwarded to A), its twin to A.

    A has one slot: before each measured turn a small filler mind takes it, so both turns of
    a pair page their mind in from RAM alike; the hand-off B asks after its forwarded turn is
    waited for before the twin's turn (it would run beside it on A)."""
    words = TEXT.split()
    n_text = len(a.http.post("/tokenize", json={"content": TEXT}).json()["tokens"])
    history = conversation(n, len(words) / n_text)
    n_prompt = a.http.post("/v1/chat/completions/input_tokens", json={"messages": history})
    result = ForwardResult(int(n_prompt.json()["input_tokens"]), [], [])
    follow = [*history, {"role": "user", "content": "And the lighthouse keeper?"}]
    filler = [{"role": "user", "content": "Hello."}]
    for i in range(n_pairs):
        names = (f"fwd{n}-{i}", f"dir{n}-{i}")
        for name in names:
            chat_turn(a, name, history)  # A builds (and holds) the mind
        handoffs = int(a.shared()["handoffs"])
        chat_turn(a, "filler", filler)
        result.forwarded_s.append(chat_turn(b, names[0], follow))
        deadline = time.monotonic() + 60
        while int(a.shared()["handoffs"]) == handoffs and time.monotonic() < deadline:
            time.sleep(0.05)
        chat_turn(a, "filler", filler)
        result.direct_s.append(chat_turn(a, names[1], follow))
        print(
            f"forward {result.n_tokens}: forwarded {result.forwarded_s[-1] * 1e3:.1f} ms, "
            f"direct {result.direct_s[-1] * 1e3:.1f} ms",
            flush=True,
        )
    return result


def delta(after: dict[str, Any], before: dict[str, Any], key: str) -> float:
    return float(after["resumes"][key]) - float(before["resumes"][key])


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kvswap-bench-cluster-"))
    redis_port = free_port()
    redis = start_redis(redis_port, root / "redis", root / "redis.log", persistent=False)
    model = args.model or str(default_model_path())
    serve = ["-m", model, "-c", str(args.ctx), "-np", "1", "-t", str(args.threads), "-tb",
             str(args.threads), "--shared-tier-lease-ms", str(args.lease_ms)]  # fmt: skip
    url = f"redis://127.0.0.1:{redis_port}/0"
    ports = (free_port(), free_port())
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    a, b = (Replica(n, root, url, serve, p, peers) for n, p in zip("ab", ports, strict=True))
    try:
        a.wait()
        b.wait()
        words = a.http.post("/tokenize", json={"content": TEXT * 800}).json()["tokens"]
        sizes: list[SizeResult] = []
        for n in args.sizes:
            sizes.append(resume_and_reprefill(a, b, words, n, args.measure_max, sizes))
            got = sizes[-1]
            est = " (estimated)" if got.reprefill_estimated else ""
            print(f"size {n}: resume {got.resume.ttft_s * 1e3:.0f} ms, re-prefill "
                  f"{got.reprefill_s * 1e3:.0f} ms{est}", flush=True)  # fmt: skip
        bandwidth = tier_bandwidth(url)
        per_turn = bytes_per_turn(b, words, args.delta_size)
        forwards = [forwarded_turns(a, b, n, args.forward_turns) for n in args.forward_sizes]
        takeover = kill_and_take_over(a, b, words, args.delta_size)
    finally:
        for replica in (a, b):
            replica.http.close()
            replica.proc.stop(60)
        redis.stop()
    return {"sizes": sizes, "per_turn": per_turn, "takeover": takeover, "forwards": forwards,
            "root": str(root), "bandwidth": bandwidth}  # fmt: skip


def resume_and_reprefill(
    a: Replica, b: Replica, words: list[int], n: int, measure_max: int, done: list[SizeResult]
) -> SizeResult:
    """A builds an n-token mind and hands it off; B resumes it, then re-prefills the same turn
    under a fresh name (estimated past `measure_max` from the last measured re-prefill)."""
    print(f"size {n}: A builds the mind (a full prefill)", flush=True)
    turn(a, f"m{n}", words[:n])
    given = a.http.post("/cluster/handoff", json={"mind": f"m{n}"}).json()
    assert given["handed_off"], given
    prompt = words[: n + N_NEW]
    before = b.shared()
    resumed = turn(b, f"m{n}", prompt)
    after = b.shared()
    fetched = after["fetches"]["bytes_read"] - before["fetches"]["bytes_read"]
    split = [delta(after, before, k) for k in ("fetch_s", "verify_s", "restore_s")]
    if n <= measure_max:
        print(f"size {n}: B re-prefills the same turn (a fresh mind)", flush=True)
        cold = turn(b, f"cold{n}", prompt)
        return SizeResult(n, resumed, cold.ttft_s, False, cold.text == resumed.text, cold,
                          fetched, *split)  # fmt: skip
    measured = next(r.cold for r in reversed(done) if r.cold is not None)
    rate_tok_s = measured.prompt_n / (measured.prompt_ms / 1e3)
    overhead_s = measured.ttft_s - measured.prompt_ms / 1e3  # the turn beyond its prefill
    estimate = len(prompt) / rate_tok_s + overhead_s
    return SizeResult(n, resumed, estimate, True, None, None, fetched, *split)


def bytes_per_turn(b: Replica, words: list[int], n: int) -> dict[str, float]:
    """Three turns of +32 tokens on B's n-token mind: the bytes each publication wrote, against
    the page (the bytes it wrote plus those older generations still serve)."""
    prompt = words[: n + N_NEW]
    written, pages = [], []
    for i in range(3):
        prompt = prompt + words[n + N_NEW * (i + 1) : n + N_NEW * (i + 2)]
        before = b.shared()["publishes"]
        turn(b, f"m{n}", prompt)
        after = b.shared()["publishes"]
        written.append(after["bytes_written"] - before["bytes_written"])
        pages.append(written[-1] + after["bytes_reused"] - before["bytes_reused"])
    return {
        "n_tokens": len(prompt),
        "bytes_written": sum(written) / len(written),
        "page_bytes": sum(pages) / len(pages),
    }


def kill_and_take_over(a: Replica, b: Replica, words: list[int], n: int) -> dict[str, float]:
    """kill -9 B, which holds the n-token mind; A takes the next turn: kill to first token."""
    prompt = words[: n + N_NEW * 5]
    before = a.shared()
    t0 = time.perf_counter()
    b.proc.signal(9)
    b.proc.proc.wait(60)
    t_sent = time.perf_counter()
    done = turn(a, f"m{n}", prompt)
    after = a.shared()
    return {
        "total_s": t_sent - t0 + done.ttft_s,
        "lease_wait_s": delta(after, before, "lease_wait_s"),
        "fetch_s": delta(after, before, "fetch_s"),
        "restore_s": delta(after, before, "restore_s"),
        "prefill_s": delta(after, before, "prefill_s"),
        "prompt_n": done.prompt_n,
    }


def report(result: dict[str, Any], args: argparse.Namespace, load: str) -> str:
    lines = [
        "| mind tokens | resume TTFT ms | re-prefill TTFT ms | re-prefill / resume | page MB "
        "| fetch ms (verify) | restore ms | fetch GB/s | same token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["sizes"]:
        est = " (estimated)" if r.reprefill_estimated else ""
        gbps = r.n_bytes / r.fetch_s / 1e9 if r.fetch_s > 0 else 0.0
        same = "-" if r.identical is None else ("yes" if r.identical else "no")
        lines.append(
            f"| {r.n_tokens} | {r.resume.ttft_s * 1e3:.0f} | {r.reprefill_s * 1e3:.0f}{est} | "
            f"{r.reprefill_s / r.resume.ttft_s:.0f}x | {r.n_bytes / 1e6:.1f} | "
            f"{r.fetch_s * 1e3:.0f} ({r.verify_s * 1e3:.0f}) | {r.restore_s * 1e3:.1f} | "
            f"{gbps:.2f} | {same} |"
        )
    lines += ["", *floor_lines(result)]
    pt, tk = result["per_turn"], result["takeover"]
    lines += [
        "",
        f"Bytes written per turn, a {args.delta_size}-token mind adding {N_NEW} tokens (mean of "
        f"3 turns): {pt['bytes_written'] / 1e6:.2f} MB of a {pt['page_bytes'] / 1e6:.1f} MB page "
        f"({100 * pt['bytes_written'] / pt['page_bytes']:.2f}%).",
        "",
        f"Takeover after kill -9 (lease {args.lease_ms} ms): {tk['total_s'] * 1e3:.0f} ms from "
        f"the kill to the first token on the other replica: lease wait "
        f"{tk['lease_wait_s'] * 1e3:.0f} ms, fetch {tk['fetch_s'] * 1e3:.0f} ms, restore "
        f"{tk['restore_s'] * 1e3:.1f} ms, prefill of {tk['prompt_n']} new tokens "
        f"{tk['prefill_s'] * 1e3:.0f} ms.",
        "",
        "| chat tokens | forwarded turn TTFT ms (median) | direct turn TTFT ms (median) "
        "| forwarding costs ms |",
        "|---|---|---|---|",
        *[
            f"| {f.n_tokens} | {median(f.forwarded_s) * 1e3:.1f} | {median(f.direct_s) * 1e3:.1f} "
            f"| {(median(f.forwarded_s) - median(f.direct_s)) * 1e3:.1f} |"
            for f in result["forwards"]
        ],
        "",
        f"Model {Path(args.model or default_model_path()).name}, -t {args.threads}, one slot per "
        f"replica, loopback Redis; load average at the start: {load}.",
    ]
    return "\n".join(lines) + "\n"


def floor_lines(result: dict[str, Any]) -> list[str]:
    """Each resume against its floor (the page at the tier's raw bandwidth, B's restore, B's
    prefill of the turn's new tokens)."""
    bandwidth = result["bandwidth"]
    lines = [
        f"Resume against its floor (the tier's raw bandwidth {bandwidth / 1e9:.2f} GB/s, pipelined "
        "GETs over 4 connections):",
        "",
        "| mind tokens | resume TTFT ms | floor ms (fetch + restore + prefill) | resume / floor |",
        "|---|---|---|---|",
    ]
    for r in result["sizes"]:
        f = floor_of(r.n_bytes, bandwidth, r.restore_s, r.resume.prompt_ms / 1e3)
        lines.append(
            f"| {r.n_tokens} | {r.resume.ttft_s * 1e3:.0f} | {f.total_s * 1e3:.0f} "
            f"({f.fetch_s * 1e3:.0f} + {f.restore_s * 1e3:.1f} + {f.prefill_s * 1e3:.0f}) | "
            f"{r.resume.ttft_s / f.total_s:.2f}x |"
        )
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = result["sizes"]
    x = range(len(sizes))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([i - 0.2 for i in x], [r.resume.ttft_s for r in sizes], 0.4, label="resume via Redis")
    bars = ax.bar(
        [i + 0.2 for i in x], [r.reprefill_s for r in sizes], 0.4, label="forced re-prefill"
    )
    for bar, r in zip(bars, sizes, strict=True):
        if r.reprefill_estimated:
            bar.set_hatch("//")
            bar.set_label("_")
    ax.set_xticks(list(x), [f"{r.n_tokens} tokens" for r in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("time to first token (s, log)")
    ax.set_title("A turn on a replica that never saw the mind (hatched: estimated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvswap bench cluster", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1024,4096,8064", help="mind sizes in tokens")
    p.add_argument(
        "--measure-max",
        type=int,
        default=8064,
        help="re-prefills of larger minds are estimated from the measured rate",
    )
    p.add_argument(
        "--delta-size",
        type=int,
        default=4096,
        help="the mind (one of --sizes) for bytes per turn and the takeover",
    )
    p.add_argument(
        "--forward-sizes", default="1024,4096", help="chat sizes in tokens for the forwarded turn"
    )
    p.add_argument("--forward-turns", type=int, default=5, help="forwarded/direct pairs per size")
    p.add_argument("--model", help="GGUF model (default: the embedded SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=1, help="threads per replica (-t, -tb)")
    p.add_argument("--lease-ms", type=int, default=5000)
    p.add_argument("--ctx", type=int, default=8192, help="each replica's -c (16k minds: 20480)")
    p.add_argument("--out", type=Path, help="write bench-cluster.md and bench-cluster.png here")
    args = p.parse_args(argv)  # fmt: skip
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.forward_sizes = [int(s) for s in args.forward_sizes.split(",") if s]
    if args.delta_size not in args.sizes:
        p.error(f"--delta-size {args.delta_size} must be one of --sizes")
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    result = run(args)
    text = report(result, args, load)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench-cluster.md").write_text(text)
        plot(result, args.out / "bench-cluster.png")
    return 0
