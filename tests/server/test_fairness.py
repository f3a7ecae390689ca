"""Continuous batching: a long prefill never starves a decoding slot.

Slot 0 streams while slot 1 prefills a 4k-token prompt in 512-token steps. The check is on the
engine's own view, not on arrival times: /slots answers from a snapshot taken between two steps,
so polling it during the prefill sees, step after step, how far slot 1's prompt has gone and how
many tokens slot 0 has decoded. Every step that moved the prefill on must also have decoded a
token for slot 0 (decodes are placed first in each batch). The gaps between slot 0's tokens, as
a client sees them, are figures: `tests/server/bench_stream_gaps.py` prints them.
"""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Two slots sharing a 6144-cell pool; 512-token steps. A tiny model wide enough that a step
# takes far longer than a poll of /slots.
ARGS = ("-c", "6144", "-np", "2", "-kvu", "-ub", "512", "-b", "2048", "-t", "2", "-tb", "2",
        "--metrics")  # fmt: skip
N_LONG = 4096
LONG_PROMPT = [3 + (i * 37) % 256 for i in range(N_LONG)]  # byte tokens of the tiny vocabulary


def _decoded(slot: dict) -> int:
    return int(slot["next_token"][0]["n_decoded"])


def test_a_stream_gets_a_token_every_step_while_another_slot_prefills_4k(server_factory) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model_path("llama", seed=3, n_embd=256, n_layer=6, n_head=4, n_head_kv=4,
                            n_ctx_train=8192)  # fmt: skip
    server: ServerProcess = server_factory("-m", str(model), *ARGS)
    n_long = N_LONG
    a_started = threading.Event()
    stop_a = threading.Event()
    a_ended: list[bool] = []  # A ran out of tokens before it was stopped

    def stream_a() -> None:
        body = {"prompt": [5, 6, 7], "n_predict": 2000, "ignore_eos": True, "stream": True,
                "id_slot": 0}  # fmt: skip
        with server.client.stream("POST", "/completion", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    a_started.set()
                    if stop_a.is_set():
                        return  # closing the stream cancels the request
        a_ended.append(True)

    t = threading.Thread(target=stream_a)
    t.start()
    assert a_started.wait(60)
    b_done = threading.Event()
    progress: list[dict] = []
    b_errors: list[BaseException] = []

    def prefill_b() -> None:
        body = {"prompt": LONG_PROMPT, "n_predict": 1, "stream": True, "return_progress": True,
                "id_slot": 1}  # fmt: skip
        try:
            for event in server.stream("/completion", body):
                if "prompt_progress" in event:
                    progress.append(event["prompt_progress"])
        except BaseException as err:  # reported below
            b_errors.append(err)
        finally:
            b_done.set()

    b = threading.Thread(target=prefill_b)
    b.start()
    views: list[tuple[int, int]] = []  # (slot 1's prompt tokens processed, slot 0's decoded)
    with httpx.Client(base_url=server.url, timeout=60) as poller:
        while not b_done.wait(0.05):  # a step takes far longer: every step is seen
            slots = {s["id"]: s for s in poller.get("/slots").json()}
            # (slot 1 shows no task before B is admitted)
            views.append((slots[1].get("n_prompt_tokens_processed", 0), _decoded(slots[0])))
    b.join(60)
    stop_a.set()
    t.join(60)
    assert not b_errors, b_errors
    assert not a_ended, "slot 0's request ended before the prefill did: nothing to observe"
    assert len(progress) >= 8 and progress[-1]["processed"] == n_long, progress[-1:]
    assert server.metrics()["llamacpp:n_busy_slots_per_decode"] > 1
    # Between any two views that saw slot 1's prefill move on, slot 0 decoded as well.
    prefilling = [(p, d) for p, d in views if 0 < p < n_long]
    steps = [(v0, v1) for v0, v1 in itertools.pairwise(prefilling) if v1[0] > v0[0]]
    assert len(steps) >= 3, f"the poller saw too few steps of the prefill: {prefilling}"
    starved = [(v0, v1) for v0, v1 in steps if v1[1] <= v0[1]]
    assert not starved, f"steps that moved the prefill without a token for slot 0: {starved}"
    # A's cancelled request freed its slot.
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in server.client.get("/slots").json()):
        assert time.monotonic() < deadline, server.client.get("/slots").json()
        time.sleep(0.1)
