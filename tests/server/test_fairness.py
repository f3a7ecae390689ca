"""Continuous batching: a long prefill never starves a decoding slot."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Two slots sharing a 6144-cell pool; 512-token steps.
ARGS = (
    "-c",
    "6144",
    "-np",
    "2",
    "-kvu",
    "-ub",
    "512",
    "-b",
    "2048",
    "-t",
    "2",
    "-tb",
    "2",
    "--metrics",
)


def test_a_stream_gets_a_token_every_step_while_another_slot_prefills_4k(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS)
    long_prompt = " ".join(f"item{i}" for i in range(1400))
    n_long = len(
        server.post("/tokenize", {"content": long_prompt, "add_special": True}).json()["tokens"]
    )
    assert n_long >= 4000
    a_times: list[float] = []
    a_started = threading.Event()
    stop_a = threading.Event()

    def stream_a() -> None:
        body = {
            "prompt": chat_prompt(("user", "Tell me a long story.")),
            "n_predict": 400,
            "ignore_eos": True,
            "stream": True,
            "id_slot": 0,
        }
        with server.client.stream("POST", "/completion", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    a_times.append(time.monotonic())
                    a_started.set()
                    if stop_a.is_set():
                        return  # closing the stream cancels the request

    t = threading.Thread(target=stream_a)
    t.start()
    assert a_started.wait(60)
    progress_times: list[float] = []
    progress: list[dict] = []
    body = {
        "prompt": long_prompt,
        "n_predict": 1,
        "stream": True,
        "return_progress": True,
        "id_slot": 1,
    }
    with server.client.stream("POST", "/completion", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                obj = json.loads(line[6:])
                if "prompt_progress" in obj:
                    progress_times.append(time.monotonic())
                    progress.append(obj["prompt_progress"])
    stop_a.set()
    t.join(60)
    n_steps = len(progress)
    assert n_steps >= 8 and progress[-1]["processed"] == n_long
    # Between B's first and last progress event, A received a token at (nearly) every step.
    during = [x for x in a_times if progress_times[0] < x <= progress_times[-1]]
    assert len(during) >= n_steps - 2, (len(during), n_steps)
    gaps = [
        b - a for a, b in itertools.pairwise(a_times) if progress_times[0] < b <= progress_times[-1]
    ]
    step_s = (progress_times[-1] - progress_times[0]) / max(1, n_steps - 1)
    assert max(gaps) < 2.5 * step_s, (max(gaps), step_s)
    assert server.metrics()["llamacpp:n_busy_slots_per_decode"] > 1
    # A's cancelled request freed its slot.
    deadline = time.monotonic() + 30
    while (
        any(s["is_processing"] for s in server.client.get("/slots").json())
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not any(s["is_processing"] for s in server.client.get("/slots").json())
