"""Token gaps a streaming client sees, as figures (by hand; the tests assert behaviour only).

Usage: .venv/bin/python -m tests.server.bench_stream_gaps

1. Fairness (`test_fairness.py`'s setup, SmolLM2, 512-token steps): the gaps between slot 0's
   tokens while slot 1 prefills a 4k-token prompt, next to the prefill's step time.
2. Paging (`test_pages_concurrency.py`'s setup, SmolLM2): the gaps of two streaming slots alone,
   then while four clients page minds in and out of the two other slots, with the page verbs'
   own times.

Run it on a quiet machine; print `uptime` next to the figures.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tests.server.harness import ServerProcess, chat_prompt


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _stream_stamps(
    server: ServerProcess, body: dict, stamps: list[float], stop: threading.Event
) -> None:
    with server.client.stream("POST", "/completion", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                stamps.append(time.monotonic())
                if stop.is_set():
                    return


def fairness(tmp: Path) -> None:
    server = ServerProcess(("-c", "6144", "-np", "2", "-kvu", "-ub", "512", "-b", "2048",
                            "-t", "2", "-tb", "2"), tmp / "fair.log")  # fmt: skip
    try:
        stamps: list[float] = []
        stop = threading.Event()
        body = {"prompt": chat_prompt(("user", "Tell me a long story.")), "n_predict": 2000,
                "ignore_eos": True, "stream": True, "id_slot": 0}  # fmt: skip
        a = threading.Thread(target=_stream_stamps, args=(server, body, stamps, stop))
        a.start()
        while not stamps:
            time.sleep(0.01)
        long_prompt = " ".join(f"item{i}" for i in range(1000))
        progress: list[float] = []
        b = {"prompt": long_prompt, "n_predict": 1, "stream": True, "return_progress": True,
             "id_slot": 1}  # fmt: skip
        for event in server.stream("/completion", b):
            if "prompt_progress" in event:
                progress.append(time.monotonic())
        stop.set()
        a.join(60)
        gaps = [y - x for x, y in itertools.pairwise(stamps) if progress[0] < y <= progress[-1]]
        step = (progress[-1] - progress[0]) / max(1, len(progress) - 1)
        print(f"fairness: {len(progress)} prefill steps of {_ms(step)}; slot 0's token gaps "
              f"during them: median {_ms(statistics.median(gaps))}, worst {_ms(max(gaps))}")  # fmt: skip
    finally:
        server.stop()


def paging(tmp: Path) -> None:
    server = ServerProcess(("-c", "4096", "-np", "4", "-t", "2", "-tb", "2", "-ub", "128",
                            "--page-ram-bytes", "32M"), tmp / "paging.log")  # fmt: skip
    try:
        stop = threading.Event()
        stamps: dict[int, list[float]] = {2: [], 3: []}

        def stream(slot: int) -> None:
            while not stop.is_set():
                body = {"prompt": chat_prompt(("user", f"Tell a long story number {slot}.")),
                        "n_predict": 120, "ignore_eos": True, "stream": True, "id_slot": slot,
                        "cache_prompt": False}  # fmt: skip
                _stream_stamps(server, body, stamps[slot], stop)

        streams = [threading.Thread(target=stream, args=(s,)) for s in (2, 3)]
        for t in streams:
            t.start()
        time.sleep(5)  # the baseline: the streams alone
        t_paging = time.monotonic()
        verb_ms: list[float] = []

        def pager(worker: int) -> None:
            slot = worker % 2
            for turn in range(6):
                prompt = chat_prompt(
                    ("system", f"You are agent {worker}."), ("user", f"Turn {turn}.")
                )
                server.post("/completion", {"prompt": prompt, "n_predict": 12, "id_slot": slot})
                out = server.post(f"/slots/{slot}?action=page_out&page=w{worker}").json()
                verb_ms.append(next(iter(out["timings"].values())))
                back = server.post(f"/slots/{slot}?action=page_in&page=w{worker}").json()
                verb_ms.append(next(iter(back["timings"].values())))

        pagers = [threading.Thread(target=pager, args=(w,)) for w in (0, 1)]
        for t in pagers:
            t.start()
        for t in pagers:
            t.join()
        stop.set()
        for t in streams:
            t.join(60)
        gaps = [(y, y - x) for s in stamps.values() for x, y in itertools.pairwise(s)]
        alone = [g for t, g in gaps if t < t_paging]
        during = [g for t, g in gaps if t >= t_paging]
        print(f"paging: stream gaps alone median {_ms(statistics.median(alone))} worst "
              f"{_ms(max(alone))}; while paging median {_ms(statistics.median(during))} worst "
              f"{_ms(max(during))}; page verbs max {max(verb_ms):.1f} ms")  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fairness(Path(tmp))
        paging(Path(tmp))


if __name__ == "__main__":
    main()
