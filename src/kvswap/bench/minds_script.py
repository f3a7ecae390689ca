"""The script of `kvswap bench minds`: minds taking turns, played against one server.

N minds, each opened with a long system prompt, take turns for R rounds; each turn adds a user
message and generates a short greedy answer. A `Script` keeps every mind's conversation, so it
goes on against a new server after a restart. Per turn it records what the user waited for
(client-measured wall time and time to first token) and what the server spent:

- `moved_ms`: state moves the server measured itself (kvswap's `mind_switch_ms_total`,
  llama-server's "prompt cache update took" lines at `-lv 4`);
- `lost_ms`: the prefill of tokens a mind keeping its own slot would have found cached (a
  re-prefill), at the turn's own measured prefill rate;
- on kvswap, the parts of a mind's switch from disk (`read_ms` reading it back, `restore_ms`
  applying it to its slot, from /metrics) and, when the bench can find the mind's file, the
  floor of its read (`floor_read_ms`: the same file read from the page cache into a buffer
  already in memory, by the bench itself, right after the turn).

A turn of `Turn.estimated` was not run: its times are computed from a measured prefill rate.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvswap.bench.server import BenchServer


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    n_minds: int
    n_tokens: int
    n_slots: int
    rounds: int
    budget_bytes: int
    restart: signal.Signals | None = None  # restart after the first round, by this signal
    real_limit_s: float = float("inf")  # llama-server's later rounds: run below this, else est.

    @property
    def title(self) -> str:
        return (
            f"{self.name}: {self.n_minds} minds of ~{self.n_tokens} tokens on {self.n_slots} "
            f"slot(s), {self.rounds} rounds, RAM budget {self.budget_bytes / 2**20:.0f} MiB"
        )


@dataclass
class Turn:
    mind: int
    round: int
    content: str
    wall_ms: float
    ttft_ms: float
    prompt_n: int  # tokens prefilled
    cache_n: int  # tokens found cached
    moved_ms: float  # state moves, as the server measured them
    lost_ms: float  # re-prefill of tokens the mind had before
    n_lost: int
    estimated: bool = False
    prompt_ms: float = 0.0  # the turn's prefill (its timings)
    read_ms: float = 0.0  # kvswap: the mind read back from disk (0: it was not on disk only)
    restore_ms: float = 0.0  # kvswap: that state applied to its slot
    floor_read_ms: float = 0.0  # the mind's file read from the page cache (0: not measured)

    @property
    def switch_ms(self) -> float:
        return self.moved_ms + self.lost_ms


@dataclass
class Result:
    """One case on one server."""

    case: str
    server: str
    turns: list[Turn] = field(default_factory=list)
    total_s: float = 0.0
    restart_s: float = 0.0  # the restarted server's start to a first /health 200
    notes: list[str] = field(default_factory=list)
    peak_rss_bytes: int = 0  # the server process's peak resident set (the later one's, restarted)
    rss_bound_bytes: int = 0  # weights + KV pool + RAM budget: what the peak should stay near
    peak_anon_bytes: int = 0  # ... its anonymous part's peak (`bench.server.RssPeaks`)
    peak_file_bytes: int = 0  # ... its file-backed part's peak (weights, mapped minds)
    anon_bound_bytes: int = 0  # anonymous with one mind resident (pool, compute) + RAM budget

    def rounds(self, first: int, last: int | None = None) -> list[Turn]:
        return [t for t in self.turns if t.round >= first and (last is None or t.round <= last)]

    @property
    def first_round_s(self) -> float:
        return sum(t.wall_ms for t in self.rounds(0, 0)) / 1e3

    @property
    def switch_s(self) -> float:
        return sum(t.switch_ms for t in self.rounds(1)) / 1e3

    @property
    def lost_s(self) -> float:
        return sum(t.lost_ms for t in self.rounds(1)) / 1e3

    @property
    def n_lost(self) -> int:
        return sum(t.n_lost for t in self.rounds(1))

    @property
    def n_prefilled(self) -> int:
        return sum(t.prompt_n for t in self.turns)

    @property
    def estimated(self) -> bool:
        return any(t.estimated for t in self.turns)

    def identical_to(self, other: Result) -> bool:
        """Same text as `other` on every turn both ran (estimated turns have none)."""
        return not self.first_difference(other)

    def first_difference(self, other: Result) -> str:
        theirs = {(t.round, t.mind): t.content for t in other.turns if not t.estimated}
        for t in self.turns:
            ref = theirs.get((t.round, t.mind))
            if not t.estimated and ref is not None and ref != t.content:
                return f"round {t.round}, mind {t.mind}: {t.content!r} vs {ref!r}"
        return ""

    def later_p50_s(self) -> float:
        return _quantile([t.wall_ms for t in self.rounds(1)], 0.5) / 1e3

    def ttft(self, q: float) -> float:
        return _quantile([t.ttft_ms for t in self.rounds(1)], q)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def opening(m: int, n_facts: int) -> str:
    """Mind `m`'s first prompt: a system prompt of `n_facts` facts (about 20 SmolLM2 tokens
    each), then a question."""
    facts = " ".join(
        f"Fact {j} of mind {m}: the {j % 7}th lamp of room {m * 31 + j} is lit."
        for j in range(max(1, n_facts))
    )
    return (
        f"<|im_start|>system\nYou are mind {m}. Remember these facts. {facts}<|im_end|>\n"
        f"<|im_start|>user\nWho are you, in a few words?<|im_end|>\n<|im_start|>assistant\n"
    )


def _follow(prompt: str, content: str, turn: int) -> str:
    return (
        prompt
        + content
        + f"<|im_end|>\n<|im_start|>user\nTell me fact {turn} again, briefly.<|im_end|>\n<|im_start|>assistant\n"
    )


# After a turn: the times the server measured since the last call, ms ("switch": its state
# moves; kvswap also "read" and "restore", a switch from disk's parts, "wait", the requests'
# waits for room to start, and "prefill", the engine's prompt processing).
Probe = Callable[[], dict[str, float]]
_KVSWAP_COUNTERS = {  # part: (counter, its unit in ms)
    "switch": ("mind_switch_ms_total", 1.0),
    "read": ("mind_read_ms_total", 1.0),
    "restore": ("mind_restore_ms_total", 1.0),
    "wait": ("mind_seat_wait_ms_total", 1.0),
    "prefill": ("prompt_seconds_total", 1e3),
}


def kvswap_probe(server: BenchServer) -> Probe:
    """kvswap's own figures (`--metrics`), as deltas; a counter an older kvswap lacks is 0."""
    seen = dict.fromkeys(_KVSWAP_COUNTERS, 0.0)

    def probe() -> dict[str, float]:
        text = server.client.get("/metrics").text
        deltas = {}
        for part, (name, unit_ms) in _KVSWAP_COUNTERS.items():
            found = re.search(rf"^llamacpp:{name} (\S+)$", text, re.M)
            now = float(found.group(1)) * unit_ms if found else 0.0
            deltas[part], seen[part] = now - seen[part], now
        return deltas

    return probe


def llama_probe(server: BenchServer) -> Probe:
    """llama-server's prompt cache moves (its "prompt cache update took" lines at `-lv 4`)."""
    offset = [0]

    def probe() -> dict[str, float]:
        with open(server.log.name, "rb") as f:
            f.seek(offset[0])
            data = f.read()
        offset[0] += len(data)
        text = data.decode("utf-8", "replace")
        found = re.findall(r"prompt cache update took ([0-9.]+) ms", text)
        return {"switch": sum(float(x) for x in found)}

    return probe


class Script:
    """Every mind's conversation so far; plays rounds of it against a server."""

    def __init__(self, n_minds: int, n_tokens: int, n_predict: int, label: str) -> None:
        self.n_tokens = n_tokens
        self.prompts = {m: opening(m, n_tokens // 20) for m in range(n_minds)}
        self.n_prompt: dict[int, int] = {}  # each mind's last prompt length, in tokens
        self.n_predict = n_predict
        self.label = label

    def fit_to(self, server: BenchServer) -> None:
        """Resize the openings to about `n_tokens` tokens of the server's own vocabulary."""
        for m in self.prompts:
            n_facts = self.n_tokens // 20
            for _ in range(3):
                text = opening(m, n_facts)
                resp = server.client.post("/tokenize", json={"content": text})
                n = len(resp.json()["tokens"])
                if abs(n - self.n_tokens) <= self.n_tokens // 50:
                    break
                n_facts = max(1, round(n_facts * self.n_tokens / max(1, n)))
            self.prompts[m] = opening(m, n_facts)

    def play(
        self,
        server: BenchServer,
        probe: Probe,
        rounds: range,
        extra: Callable[[int], dict[str, Any]],
        floor: Callable[[int], float] | None = None,
        before: Callable[[int], None] | None = None,
    ) -> list[Turn]:
        """Play `rounds` (every mind once a round); `extra(m)` adds the request's own fields;
        `floor(m)`, when given, measures mind `m`'s read floor after a turn that read it back;
        `before(m)` runs before mind `m`'s turn (`--cold`: its file leaves the page cache)."""
        turns = []
        n_turns = len(rounds) * len(self.prompts)
        for i, (r, m) in enumerate((r, m) for r in rounds for m in self.prompts):
            progress(self.label, i, n_turns)
            if before is not None:
                before(m)
            probe()
            body = {"prompt": self.prompts[m], "n_predict": self.n_predict, "temperature": 0}
            t = time.perf_counter()
            out = server.completion({**body, **extra(m)})
            wall_ms = (time.perf_counter() - t) * 1e3
            turn = self._turn(m, r, out, wall_ms, probe())
            if floor is not None and turn.read_ms > 0:
                turn.floor_read_ms = floor(m)
            turns.append(turn)
            self.prompts[m] = _follow(self.prompts[m], out["content"], r)
        progress(self.label, n_turns, n_turns)
        return turns

    def _turn(
        self, m: int, r: int, out: dict[str, Any], wall_ms: float, moved: dict[str, float]
    ) -> Turn:
        tm = out["timings"]
        prompt_ms, predicted_ms = float(tm["prompt_ms"]), float(tm["predicted_ms"])
        prompt_n, cache_n = int(tm["prompt_n"]), int(tm.get("cache_n", 0))
        n_lost = max(0, self.n_prompt.get(m, 0) - cache_n)
        self.n_prompt[m] = prompt_n + cache_n
        per_token_ms = prompt_ms / prompt_n if prompt_n else 0.0
        return Turn(
            mind=m,
            round=r,
            content=out["content"],
            wall_ms=wall_ms,
            ttft_ms=wall_ms - predicted_ms,
            prompt_n=prompt_n,
            cache_n=cache_n,
            moved_ms=moved["switch"],
            lost_ms=n_lost * per_token_ms,
            n_lost=n_lost,
            prompt_ms=prompt_ms,
            read_ms=moved.get("read", 0.0),
            restore_ms=moved.get("restore", 0.0),
        )


def estimate(turns: Sequence[Turn], rounds: range, n_minds: int, growth: int) -> list[Turn]:
    """Turns of `rounds` not run, for a server that re-prefills every mind at each turn: at the
    prefill and decode rates measured over `turns` (each mind grows `growth` tokens a turn)."""
    n_prefill = sum(t.prompt_n for t in turns)
    prefill_ms = sum(t.ttft_ms for t in turns) / max(1, n_prefill)
    decode_ms = sum(t.wall_ms - t.ttft_ms for t in turns) / max(1, len(turns))
    size = {t.mind: t.prompt_n + t.cache_n for t in turns}
    out = []
    for r in rounds:
        for m in range(n_minds):
            n = size.get(m, 0) + growth * (r - min(t.round for t in turns))
            n_had = n - growth  # tokens it had before this turn: all re-prefilled
            out.append(
                Turn(mind=m, round=r, content="", wall_ms=n * prefill_ms + decode_ms,
                     ttft_ms=n * prefill_ms, prompt_n=n, cache_n=0, moved_ms=0.0,
                     lost_ms=n_had * prefill_ms, n_lost=n_had, estimated=True)
            )  # fmt: skip
    return out


def progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if done == total else ""
    print(
        f"\r{label:>28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} turns",
        end=end,
        file=sys.stderr,
        flush=True,
    )
