"""A bounded soak against a real server on loopback: every kind of client at once, a sleep and a
wake in the middle.

Clients (one thread each, each with its own seeded RNG):
- streamers: anonymous streamed completions of random prompts, most reusing cached prefixes
  (pressure on the anonymous cache), a quarter hanging up mid-stream;
- an impatient client whose non-streamed requests time out;
- a pager: long states restored from files made before the clients start and paged out to
  named pages (a memcpy each: the page store fills fast), page_in, page_drop, spill;
- a filer: save, restore, erase;
- a mind client: multi-turn conversations of several minds, more minds than slots (switches,
  RAM pages, the demoter's spills); every turn must find its mind holding exactly the tokens of
  its last answered turn;
- a reconfigurer: POST /reconfigure between two context sizes.

`Soak.run(duration_s)` runs them for half the duration, then pauses them all (`Gate`), drops
the named pages (a server never sleeps on pages a sleep would lose), waits until the server has
fallen asleep (`--sleep-idle-seconds`; the mind pages are spilled, the model freed), and lets
the clients go on for the other half: their first requests wake it. A sampler reads the
server's resident memory (the OS's count, not the server's) every `SAMPLE_S`, and its /metrics
for the figures. What a request may end as: a success, an intended hang-up, or a typed error
(`{"error": {code, message, type}}` with status == code, never a 500); anything else is a
failure with its description.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import psutil

from kvswap.minds.stored.records import OPENAI_CODES
from tests.server.harness import ServerProcess

SAMPLE_S = 0.25
Work = Callable[[httpx.Client, random.Random], None]
# Byte tokens of the tiny vocabulary (ids 3..258).
TOKEN_LO, TOKEN_HI = 3, 258
N_MINDS = 6
N_PAGES = 18
N_FILL_FILES = 3
MAX_MIND_TOKENS = 1200  # a conversation starts over past this (it must fit the smaller window)
SLEEP_TIMEOUT_S = 60.0


@dataclass
class Sample:
    t_s: float
    rss_bytes: int
    page_store_bytes: float  # the server's own counts: figures, never the checks
    ckpt_bytes: float


@dataclass
class SoakReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rss_asleep_bytes: int = 0
    t_asleep_s: float = 0.0  # from the pause to the server asleep
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)
            self.outcomes["FAILED"] += 1

    def served(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k.startswith("ok"))

    def summary(self, rss_base: int, page_ceiling: int) -> str:
        rss = [s.rss_bytes for s in self.samples]
        peak_pages = max(s.page_store_bytes for s in self.samples)
        mib = 1 << 20
        return "\n".join(
            [
                f"requests served: {self.served()} ({sum(self.outcomes.values())} in all)",
                f"outcomes: {dict(sorted(self.outcomes.items()))}",
                f"RSS: base {rss_base / mib:.1f} MiB, peak {max(rss) / mib:.1f} MiB, asleep "
                f"{self.rss_asleep_bytes / mib:.1f} MiB, final {rss[-1] / mib:.1f} MiB "
                f"({len(rss)} samples)",
                f"page store: peak {peak_pages / mib:.1f} MiB of {page_ceiling / mib:.0f} MiB",
                f"asleep {self.t_asleep_s:.1f} s after the pause",
            ]
        )


def classify(resp: httpx.Response, body: bytes) -> str:
    """'ok', or the typed error's type; raises AssertionError for anything untyped or a 500."""
    if resp.status_code < 400:
        return "ok"
    err = json.loads(body)["error"]
    # The status, or OpenAI's own code for that status where OpenAI names one.
    assert err["code"] == resp.status_code or OPENAI_CODES.get(err["code"]) == resp.status_code
    assert resp.status_code != 500 and err["type"] != "server_error", body[:500]
    return f"{resp.status_code} {err['type']}"


class Gate:
    """Lets clients start requests while open; `close()` returns once none is in flight."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = True
        self._in_flight = 0

    def enter(self, stop: threading.Event) -> bool:
        """Wait until open (False once `stop` is set), then count a request in flight."""
        with self._cond:
            while not self._open:
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
            self._in_flight += 1
            return not stop.is_set()

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._open = False
            assert self._cond.wait_for(lambda: self._in_flight == 0, timeout_s), "clients stuck"

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()


@dataclass
class Mind:
    """What a mind client knows of one mind: its text so far, and the tokens its KV holds."""

    text: list[int] = field(default_factory=list)
    kv: int = 0
    epoch: int = 0  # a conversation that grew too long starts over as a new mind
    # A slot verb's answer named it: an erase or page_out of its slot ended it (README: slot
    # verbs act on a mind's slot), so a turn seated after that finds it empty. `n_ends` is
    # counted by the verb clients; `n_seen`, by the one mind client, is how many of them a
    # turn has found (an end reported while a turn ran may have come before or after its
    # seat: the turn's own cache_n tells which).
    n_ends: int = 0
    n_seen: int = 0


class Soak:
    def __init__(self, server: ServerProcess, seed: int, n_ctx: tuple[int, int]) -> None:
        self.server = server
        self.url = server.url
        self.seed = seed
        self.n_ctx = n_ctx  # the two context sizes the reconfigurer alternates
        self.n_slots = len(server.client.get("/slots").json())
        self.report = SoakReport()
        self._stop = threading.Event()
        self._gate = Gate()
        self._sampling = threading.Event()
        self._sampling.set()
        self._minds = [Mind() for _ in range(N_MINDS)]
        self._refill = threading.Event()  # the pager fills every page first (after the wake)

    def _make_fill_files(self, client: httpx.Client, rng: random.Random) -> None:
        """Long states on disk, which the pager restores and pages out to fill the store."""
        for k in range(N_FILL_FILES):
            prompt = self._prompt(rng, MAX_MIND_TOKENS - 300, MAX_MIND_TOKENS)
            body = {"prompt": prompt, "n_predict": 1, "id_slot": 0}
            assert client.post("/completion", json=body).status_code == 200
            saved = client.post("/slots/0?action=save", json={"filename": f"fill{k}.bin"})
            assert saved.status_code == 200, saved.text
        assert client.post("/slots/0?action=erase").status_code == 200

    def run(self, duration_s: float, n_streamers: int = 3) -> SoakReport:
        workers: list[Work] = [self._streamer] * n_streamers
        workers += [self._impatient, self._pager, self._filer, self._minder, self._reconfigurer]
        threads = [
            threading.Thread(target=self._loop, args=(w, random.Random(self.seed + i)))
            for i, w in enumerate(workers)
        ]
        sampler = threading.Thread(target=self._sample_loop)
        sampler.start()
        with httpx.Client(base_url=self.url, timeout=120) as client:
            self._make_fill_files(client, random.Random(self.seed))
            self._fill_all(client, random.Random(self.seed))
        for t in threads:
            t.start()
        try:
            self._stop.wait(duration_s / 2)
            self._sleep_and_wake()
            self._stop.wait(duration_s / 2)
        finally:
            self._stop.set()
            self._gate.open()
            for t in threads:
                t.join(120)
            sampler.join(10)
        self._sample()
        return self.report

    def _loop(self, work: Work, rng: random.Random) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while self._gate.enter(self._stop):
                try:
                    work(client, rng)
                except (AssertionError, httpx.HTTPError, ValueError, KeyError) as err:
                    self.report.fail(f"{work.__name__}: {err!r}")
                finally:
                    self._gate.leave()

    # -- the sleep in the middle ------------------------------------------------------------

    def _sleep_and_wake(self) -> None:
        """Pause every client, drop the named pages, and wait until the server sleeps."""
        t0 = time.monotonic()
        n_slept = self.server.log_path.read_text().count("sleeping after")
        self._gate.close(timeout_s=120)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            for k in range(N_PAGES):
                client.post(f"/slots/0?action=page_drop&page=page{k}")
        self._sampling.clear()  # /metrics would count as activity: RSS only while waiting
        deadline = time.monotonic() + SLEEP_TIMEOUT_S
        while self.server.log_path.read_text().count("sleeping after") == n_slept:
            assert time.monotonic() < deadline, "the server did not fall asleep"
            self._stop.wait(0.1)
        self.report.t_asleep_s = time.monotonic() - t0
        self.report.rss_asleep_bytes = psutil.Process(self.server.proc.pid).memory_info().rss
        self.report.record("ok slept")
        self._refill.set()
        self._sampling.set()
        self._gate.open()

    # -- clients ----------------------------------------------------------------------------

    def _prompt(self, rng: random.Random, lo: int = 8, hi: int = 300) -> list[int]:
        return [rng.randint(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(lo, hi))]

    def _post(self, client: httpx.Client, path: str, body: dict | None = None) -> httpx.Response:
        resp = client.post(path, json=body)
        self.report.record(classify(resp, resp.content))
        ends = ("action=erase", "action=page_out")  # (a save names the mind, which stays)
        if path.startswith("/slots/") and any(e in path for e in ends) and resp.status_code == 200:
            self._ended(resp.json().get("mind"))
        return resp

    def _ended(self, name: str | None) -> None:
        """A slot verb acted on mind `name` (`m{i}-{epoch}`): an erase or page_out ended it."""
        if name is None:
            return
        i, epoch = (int(part) for part in name[1:].split("-"))
        mind = self._minds[i]
        if mind.epoch == epoch:
            mind.n_ends += 1

    def _streamer(self, client: httpx.Client, rng: random.Random) -> None:
        body = {
            "prompt": self._prompt(rng),
            "n_predict": rng.randint(4, 64),
            "stream": True,
            "cache_prompt": rng.random() < 0.8,
        }
        hang_up_after = rng.randint(1, 8) if rng.random() < 0.25 else None
        with client.stream("POST", "/completion", json=body) as resp:
            if resp.status_code >= 400:
                self.report.record(classify(resp, resp.read()))
                return
            n_events = 0
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                assert "error" not in event, event
                n_events += 1
                if hang_up_after is not None and n_events >= hang_up_after:
                    self.report.record("client hung up mid-stream")
                    return  # leaving the block closes the connection
            assert event.get("stop") is True, event
        self.report.record("ok")

    def _impatient(self, client: httpx.Client, rng: random.Random) -> None:
        """A non-streamed request whose client gives up before the answer."""
        body = {"prompt": self._prompt(rng), "n_predict": 64}
        try:
            resp = client.post("/completion", json=body, timeout=rng.uniform(0.01, 0.3))
        except httpx.TimeoutException:
            self.report.record("client timed out")
            return
        self.report.record(classify(resp, resp.content))

    def _fill_all(self, client: httpx.Client, rng: random.Random) -> None:
        for k in range(N_PAGES):
            self._fill(client, rng, rng.randrange(self.n_slots), f"page{k}")

    def _fill(self, client: httpx.Client, rng: random.Random, slot: int, page: str) -> None:
        """A long state restored into `slot` and paged out to `page` (memcpys: fast)."""
        body = {"filename": f"fill{rng.randrange(N_FILL_FILES)}.bin"}
        if self._post(client, f"/slots/{slot}?action=restore", body).status_code == 200:
            self._post(client, f"/slots/{slot}?action=page_out&page={page}")

    def _pager(self, client: httpx.Client, rng: random.Random) -> None:
        if self._refill.is_set():
            self._refill.clear()
            self._fill_all(client, rng)
            return
        slot = rng.randrange(self.n_slots)
        page = f"page{rng.randrange(N_PAGES)}"
        verb = rng.choice(["fill", "fill", "fill", "page_in", "page_drop", "spill"])
        if verb == "fill":
            self._fill(client, rng, slot, page)
            return
        spill = {"filename": f"spill{rng.randrange(3)}.bin", "drop": rng.random() < 0.5}
        path = f"/slots/{slot}?action={verb}&page={page}"
        self._post(client, path, spill if verb == "spill" else None)

    def _filer(self, client: httpx.Client, rng: random.Random) -> None:
        slot = rng.randrange(self.n_slots)
        verb = rng.choice(["save", "restore", "erase"])
        body = {"filename": f"file{rng.randrange(3)}.bin"}
        self._post(client, f"/slots/{slot}?action={verb}", body if verb != "erase" else None)

    def _minder(self, client: httpx.Client, rng: random.Random) -> None:
        """A turn of one mind; it must be found holding exactly its last turn's tokens."""
        i = rng.randrange(N_MINDS)
        mind = self._minds[i]
        if len(mind.text) > MAX_MIND_TOKENS - 100:
            self._minds[i] = mind = Mind(epoch=mind.epoch + 1)
        prompt = mind.text + self._prompt(rng, 20, 80)
        body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "mind": f"m{i}-{mind.epoch}"}  # fmt: skip
        n_ends_before = mind.n_ends
        resp = self._post(client, "/completion", body)
        if resp.status_code != 200:
            return  # typed (a full store); the mind keeps its state
        out = resp.json()
        cache_n = out["timings"]["cache_n"]
        name = f"m{i}-{mind.epoch}"
        # A mind found with no state is served as new: it may start from a prefix its tenant's
        # anonymous cache holds (a restored slot file can hold this mind's own tokens), so
        # cache_n says nothing then; a mind found holding its state has exactly its tokens.
        new = out["mind"]["tier_before"] == "new"
        if n_ends_before > mind.n_seen:  # ended before this turn was sent: found new
            assert new, (name, "ended", out["mind"])
            mind.n_seen = n_ends_before
        elif new and mind.kv:  # found new: only by an end reported while the turn ran
            assert mind.n_ends > n_ends_before, (name, "lost", out["mind"], mind.kv)
            mind.n_seen += 1
        elif not new:  # (an end reported while it ran, after its seat: the next one is new)
            assert cache_n == mind.kv, (name, cache_n, mind.kv)
        mind.text = prompt + out["tokens"]
        mind.kv = len(mind.text) - 1
        self.report.record("ok mind turn")

    def _reconfigurer(self, client: httpx.Client, rng: random.Random) -> None:
        self._stop.wait(rng.uniform(2, 4))
        if self._stop.is_set():
            return
        n_ctx = self.n_ctx[rng.randrange(2)]
        if self._post(client, "/reconfigure", {"n_ctx": n_ctx}).status_code == 200:
            self.report.record("ok reconfigure")

    # -- samples ----------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        rss = psutil.Process(self.server.proc.pid).memory_info().rss
        metrics: dict[str, float] = {}
        if self._sampling.is_set():
            for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
                if line.startswith("llamacpp:"):
                    name, value = line.removeprefix("llamacpp:").rsplit(" ", 1)
                    metrics[name] = float(value)
        store, ckpt = metrics.get("page_store_bytes", 0.0), metrics.get("ctx_checkpoint_bytes", 0.0)
        with self.report.lock:
            self.report.samples.append(Sample(time.monotonic(), rss, store, ckpt))
