"""A bounded soak against a real server on loopback: streaming clients (some hang up mid-stream),
non-streamed clients that time out, page verbs and slot files, all at once.

`Soak.run(duration_s)` drives the clients from threads and samples the server's /metrics and
resident memory every `SAMPLE_S`; `SoakReport` holds the outcome of every request by kind and
the samples. What a request may end as: a success, an intended hang-up, or a typed error
(`{"error": {code, message, type}}` with status == code, never a 500). Anything else is
recorded as a failure with its description.
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

SAMPLE_S = 0.25
Work = Callable[[httpx.Client, random.Random], None]
# Byte tokens of the tiny vocabulary (ids 3..258).
TOKEN_LO, TOKEN_HI = 3, 258


@dataclass
class Sample:
    t_s: float
    rss_bytes: int
    page_store_bytes: float
    page_spill_held_bytes: float
    ctx_checkpoint_bytes: float


@dataclass
class SoakReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)
            self.outcomes["FAILED"] += 1

    def served(self) -> int:
        return self.outcomes["ok"]

    def errors(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.outcomes.items()) if k != "ok"}

    def summary(self, page_ceiling: int, ckpt_budget: int) -> str:
        rss = [s.rss_bytes for s in self.samples]
        peak_pages = max(s.page_store_bytes for s in self.samples)
        peak_ckpt = max(s.ctx_checkpoint_bytes for s in self.samples)
        mib = 1 << 20
        return "\n".join(
            [
                f"requests served: {self.served()} ({sum(self.outcomes.values())} in all)",
                f"errors by type: {self.errors()}",
                f"RSS: start {rss[0] / mib:.1f} MiB, peak {max(rss) / mib:.1f} MiB, "
                f"final {rss[-1] / mib:.1f} MiB ({len(rss)} samples)",
                f"page store: peak {peak_pages / 1024:.0f} KiB of {page_ceiling / 1024:.0f} KiB",
                f"checkpoints: peak {peak_ckpt / 1024:.0f} KiB of {ckpt_budget / 1024:.0f} KiB",
            ]
        )


def classify(resp: httpx.Response, body: bytes) -> str:
    """'ok', or the typed error's type; raises AssertionError for anything untyped or a 500."""
    if resp.status_code < 400:
        return "ok"
    err = json.loads(body)["error"]
    assert err["code"] == resp.status_code, body[:500]
    assert resp.status_code != 500 and err["type"] != "server_error", body[:500]
    return f"{resp.status_code} {err['type']}"


class Soak:
    def __init__(self, url: str, pid: int, seed: int, n_slots: int) -> None:
        self.url = url
        self.pid = pid
        self.seed = seed
        self.n_slots = n_slots
        self.report = SoakReport()
        self._stop = threading.Event()

    def run(self, duration_s: float, n_streamers: int = 3) -> SoakReport:
        workers: list[Work] = [self._streamer] * n_streamers
        workers += [self._impatient, self._pager, self._filer]
        threads = [
            threading.Thread(target=self._loop, args=(w, random.Random(self.seed + i)))
            for i, w in enumerate(workers)
        ]
        sampler = threading.Thread(target=self._sample_loop)
        sampler.start()
        for t in threads:
            t.start()
        time.sleep(duration_s)
        self._stop.set()
        for t in threads:
            t.join(120)
        sampler.join(10)
        self._sample()
        return self.report

    def _loop(self, work: Work, rng: random.Random) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self._stop.is_set():
                try:
                    work(client, rng)
                except (AssertionError, httpx.HTTPError, ValueError, KeyError) as err:
                    self.report.fail(f"{work.__name__}: {err!r}")

    def _prompt(self, rng: random.Random) -> list[int]:
        return [rng.randint(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(8, 300))]

    def _post(self, client: httpx.Client, path: str, body: dict | None = None) -> None:
        resp = client.post(path, json=body)
        self.report.record(classify(resp, resp.content))

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

    def _pager(self, client: httpx.Client, rng: random.Random) -> None:
        slot = rng.randrange(self.n_slots)
        page = f"page{rng.randrange(6)}"
        verb = rng.choice(["page_out", "page_out", "page_in", "page_drop", "spill"])
        body = {"filename": f"spill{rng.randrange(3)}.bin", "drop": rng.random() < 0.5}
        self._post(
            client, f"/slots/{slot}?action={verb}&page={page}", body if verb == "spill" else None
        )

    def _filer(self, client: httpx.Client, rng: random.Random) -> None:
        slot = rng.randrange(self.n_slots)
        verb = rng.choice(["save", "restore", "erase"])
        body = {"filename": f"file{rng.randrange(3)}.bin"}
        self._post(client, f"/slots/{slot}?action={verb}", body if verb != "erase" else None)
        time.sleep(0.05)

    def _sample_loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        metrics = {}
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                metrics[name.removeprefix("llamacpp:")] = float(value)
        rss = psutil.Process(self.pid).memory_info().rss
        sample = Sample(
            t_s=time.monotonic(),
            rss_bytes=rss,
            page_store_bytes=metrics["page_store_bytes"],
            page_spill_held_bytes=metrics["page_spill_held_bytes"],
            ctx_checkpoint_bytes=metrics["ctx_checkpoint_bytes"],
        )
        with self.report.lock:
            self.report.samples.append(sample)
