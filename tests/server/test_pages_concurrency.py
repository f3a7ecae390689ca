"""Concurrency of page verbs.

- Racing verbs on one slot: page_in of one page and page_out of the slot, several of each, are
  all queued on the server at once (behind a stream that holds the slot; /metrics shows them
  deferred together, so no client serialized them) and then run in whatever order they landed.
  Whatever the order, each state moves and is never copied: the page goes into the slot exactly
  once, a page_out captures a state at most once, the paged state lives in exactly one place
  afterwards and continues exactly as a never-paged reference does.
- Minds moved between two slots while two other slots stream: each client pages its minds in
  and out of its slot around each turn (a client-side lock per slot keeps each conversation's
  protocol in order; the races above are where verbs meet), no request fails, no page is lost or
  duplicated, and every mind ends exactly as its never-paged reference. The streams' token gaps
  are figures, printed by `tests/server/bench_stream_gaps.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = [pytest.mark.model, pytest.mark.slow]

ARGS = (
    "-c",
    "4096",
    "-np",
    "4",
    "-t",
    "2",
    "-tb",
    "2",
    "-ub",
    "128",
    "--page-ram-bytes",
    "32M",
    "--metrics",
)
N_MINDS = 8
TURNS = ("Who are you?", "What do you like?", "Say goodbye.")


def _turn_prompt(mind: int, history: str, question: str) -> str:
    if not history:
        history = f"<|im_start|>system\nYou are agent number {mind}.<|im_end|>\n"
    return history + f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def _complete(server: ServerProcess, prompt: str, slot: int) -> dict:
    resp = server.post(
        "/completion",
        {
            "prompt": prompt,
            "n_predict": 12,
            "temperature": 0,
            "id_slot": slot,
            "return_tokens": True,
        },
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def _conversation(
    server: ServerProcess, mind: int, slot: int, before_turn=None, after_turn=None
) -> list[list[int]]:  # type: ignore[no-untyped-def]
    history = ""
    outputs = []
    for turn, question in enumerate(TURNS):
        prompt = _turn_prompt(mind, history, question)
        if before_turn:
            before_turn(turn)
        result = _complete(server, prompt, slot)
        if after_turn:
            after_turn(turn)
        outputs.append(result["tokens"])
        history = prompt + result["content"] + "<|im_end|>\n"
    return outputs


@pytest.mark.timeout(900)  # minutes of streaming; a loaded 2-core machine needs more than 300 s
def test_paging_minds_while_other_slots_stream(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(*ARGS)
    references = {m: _conversation(server, m, slot=2) for m in range(N_MINDS)}
    stop = threading.Event()
    failures: list[str] = []
    n_streamed = [0, 0]

    def stream(slot: int) -> None:
        while not stop.is_set():
            body = {
                "prompt": chat_prompt(("user", f"Tell a long story number {slot}.")),
                "n_predict": 120,
                "ignore_eos": True,
                "stream": True,
                "id_slot": slot,
                "cache_prompt": False,
            }
            with server.client.stream("POST", "/completion", json=body) as resp:
                if resp.status_code != 200:
                    failures.append(f"stream {slot}: {resp.status_code}")
                    return
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        n_streamed[slot - 2] += 1
                        if stop.is_set():
                            break

    slot_locks = [threading.Lock(), threading.Lock()]
    results: dict[int, list[list[int]]] = {}

    def verb(slot: int, action: str, mind: int) -> None:
        resp = server.post(f"/slots/{slot}?action={action}&page=mind{mind}")
        if resp.status_code != 200:
            failures.append(f"{action} mind{mind}: {resp.status_code} {resp.text}")

    def client(worker: int) -> None:
        minds = [worker, worker + 4]
        try:
            for mind in minds:
                slot = worker % 2
                lock = slot_locks[slot]

                def before(
                    turn: int, mind: int = mind, slot: int = slot, lock: threading.Lock = lock
                ) -> None:
                    lock.acquire()
                    if turn > 0:
                        verb(slot, "page_in", mind)

                def after(
                    turn: int, mind: int = mind, slot: int = slot, lock: threading.Lock = lock
                ) -> None:
                    verb(slot, "page_out", mind)
                    lock.release()

                results[mind] = _conversation(server, mind, slot, before, after)
        except Exception as err:  # reported below
            failures.append(f"worker {worker}: {err!r}")

    background = [threading.Thread(target=stream, args=(s,)) for s in (2, 3)]
    for t in background:
        t.start()
    workers = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(600)
    stop.set()
    for t in background:
        t.join(120)

    assert not failures, failures
    for mind in range(N_MINDS):
        assert results[mind] == references[mind], (
            f"mind {mind} differs from its never-paged reference"
        )
    pages = server.client.get("/pages").json()
    assert sorted(p["name"] for p in pages["pages"]) == sorted(f"mind{m}" for m in range(N_MINDS))
    assert all(n > 0 for n in n_streamed), n_streamed  # the streams ran throughout


# -- racing verbs on one slot -----------------------------------------------------------------

RACE_ARGS = ("-c", "8192", "-np", "2", "-t", "1", "-tb", "1", "--page-ram-bytes", "32M",
             "--metrics")  # fmt: skip
N_RACERS = 3  # of each verb
PROBE = [7, 8]


def _ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


def _typed(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["code"] == status, resp.text


def _continue(server: ServerProcess, slot: int, kv: list[int]) -> list[int]:
    """Greedy tokens after the state `kv` held by `slot` (all of it must be reused)."""
    body = {"prompt": [*kv, *PROBE], "n_predict": 4, "temperature": 0, "id_slot": slot,
            "return_tokens": True}  # fmt: skip
    out = _ok(server.post("/completion", body))
    assert out["timings"]["cache_n"] == len(kv), out["timings"]
    return list(out["tokens"])


def _race(server: ServerProcess, calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Queue every call on the server at once behind a stream holding slot 0, then free it."""
    blocker_started = threading.Event()
    release = threading.Event()
    blocker_ended_alone: list[bool] = []

    def block() -> None:
        body = {"prompt": [9] * 64, "n_predict": 3000, "ignore_eos": True, "stream": True,
                "id_slot": 0}  # fmt: skip
        with (
            httpx.Client(base_url=server.url, timeout=120) as c,
            c.stream("POST", "/completion", json=body) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    blocker_started.set()
                    if release.is_set():
                        return  # hanging up cancels it: the slot frees for the verbs
        blocker_ended_alone.append(True)

    blocker = threading.Thread(target=block)
    blocker.start()
    assert blocker_started.wait(60)
    answers: list[httpx.Response | None] = [None] * len(calls)

    def run(i: int) -> None:
        answers[i] = calls[i]()

    racers = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in racers:
        t.start()
    deadline = time.monotonic() + 60
    while server.metrics()["llamacpp:requests_deferred"] < len(calls):
        assert time.monotonic() < deadline and not blocker_ended_alone, "racers not all queued"
        time.sleep(0.01)
    release.set()
    blocker.join(60)
    for t in racers:
        t.join(60)
    assert not blocker_ended_alone, "the stream ended before the racers were all queued"
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


@pytest.mark.timeout(300)
def test_verbs_racing_on_one_slot_move_each_state_exactly_once(server_factory) -> None:  # type: ignore[no-untyped-def]
    model = tiny_model_path("llama", seed=5, n_embd=128, n_ctx_train=8192)
    server: ServerProcess = server_factory("-m", str(model), *RACE_ARGS, fresh=True)
    for round_ in range(3):
        prompt = [3 + (round_ * 41 + i * 13) % 256 for i in range(40 + round_)]
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": False,
                "return_tokens": True}  # fmt: skip
        # The state S, paged out to page p; the same state computed on slot 1 is the reference.
        made = _ok(server.post("/completion", body | {"id_slot": 0}))
        kv = prompt + made["tokens"][:-1]
        assert _ok(server.post(f"/slots/0?action=page_out&page=p{round_}"))["n_tokens"] == len(kv)
        again = _ok(server.post("/completion", body | {"id_slot": 1}))
        assert again["tokens"] == made["tokens"]
        reference = _continue(server, 1, kv)
        _ok(server.post("/slots/1?action=erase"))

        page_in = f"/slots/0?action=page_in&page=p{round_}"
        outs = [f"/slots/0?action=page_out&page=q{round_}-{i}" for i in range(N_RACERS)]
        calls = [lambda path=page_in: server.post(path)] * N_RACERS
        calls += [lambda path=path: server.post(path) for path in outs]
        answers = _race(server, calls)

        ins, captures = answers[:N_RACERS], answers[N_RACERS:]
        assert sorted(a.status_code for a in ins) == [200] + [404] * (N_RACERS - 1)
        for a in ins:
            if a.status_code != 200:
                _typed(a, 404)  # the page had already gone into the slot
        taken = [a.json()["n_tokens"] for a in captures if a.status_code == 200]
        for a in captures:
            if a.status_code != 200:
                _typed(a, 400)  # the slot was empty: its state had been paged out already
        # The slot held the stream's state, then S once: at most two captures, S at most once.
        assert 1 <= len(taken) <= 2 and taken.count(len(kv)) <= 1, taken
        pages = {p["name"]: p for p in server.client.get("/pages").json()["pages"]}
        assert f"p{round_}" not in pages
        names = [
            o.rsplit("=", 1)[1] for o, a in zip(outs, captures, strict=True) if a.status_code == 200
        ]
        assert sorted(n for n in pages if n.startswith(f"q{round_}-")) == sorted(names)
        # S lives in exactly one place: a captured page, or else slot 0; and continues as the
        # reference does.
        holding = [n for n in names if pages[n]["n_tokens"] == len(kv)]
        if holding:
            _ok(server.post(f"/slots/1?action=page_in&page={holding[0]}"))
            assert _continue(server, 1, kv) == reference
        else:
            assert _continue(server, 0, kv) == reference
        for n in names:
            server.post(f"/slots/0?action=page_drop&page={n}")
