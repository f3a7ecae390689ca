"""Minds come back, whatever the server chose to do with them (issue 20), through the real
server: at the default geometry (4 slots, one unified KV pool) minds that left the slots return
with only their new tokens prefilled; slot verbs on a slot that holds a mind act on the mind
(and another API key's verb is refused without naming it); a mind larger than the page store
never stops other requests."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

# `kvswap serve -c 4096`: 4 slots with unified KV drawing on one pool of 4096 cells.
DEFAULT_ARGS = ("-c", "4096", "-t", "1", "-tb", "1", "--metrics")
N_MINDS = 8


def _system(m: int, n_facts: int) -> str:
    """A long system prompt of its own for mind m (about 13 tokens a fact)."""
    return " ".join(
        f"Fact {m}.{i}: box {i} of shelf {m} holds {i * 7 % 13} red keys." for i in range(n_facts)
    )


class Minds:
    """Each mind's conversation so far, as a client keeps it (the whole text each turn)."""

    def __init__(self, server: ServerProcess, n_minds: int, n_facts: int) -> None:
        self.server = server
        self.prompts = {
            m: chat_prompt(("system", _system(m, n_facts)), ("user", f"Which box, {m}?"))
            for m in range(n_minds)
        }
        self.n_prompt: dict[int, int] = {}  # tokens of the last prompt: cached next turn

    def turn(self, m: int, turn: int, **extra: Any) -> dict[str, Any]:
        body = {"prompt": self.prompts[m], "n_predict": 4, "temperature": 0, **extra}
        resp = self.server.post("/completion", body, headers={"X-Mind-Id": f"w{m}"})
        assert resp.status_code == 200, (m, turn, resp.text)
        out = resp.json()
        timings = out["timings"]
        self.n_prompt[m] = timings["cache_n"] + timings["prompt_n"]
        self.prompts[m] += (
            out["content"]
            + f"<|im_end|>\n<|im_start|>user\nAnd box {turn}?<|im_end|>\n<|im_start|>assistant\n"
        )
        return out


# About a minute on an idle 2-core machine; a shared, loaded one can take ten times that.
@pytest.mark.timeout(900)
def test_minds_that_left_a_full_unified_pool_come_back_with_only_new_tokens(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*DEFAULT_ARGS)
    props = server.client.get("/props").json()["context_geometry"]
    assert props["n_parallel"] == 4 and props["kv_unified"] and props["n_ctx"] == 4096
    # ~1,050 tokens each: three residents leave fewer free cells than a returning mind needs.
    minds = Minds(server, N_MINDS, n_facts=50)
    for turn in range(3):
        for m in range(N_MINDS):
            n_before = minds.n_prompt.get(m, 0)
            out = minds.turn(m, turn)
            assert out["timings"]["prompt_n"] + out["timings"]["cache_n"] > 1040
            if turn > 0:
                # It returned from a RAM page into a pool other minds had filled: only the
                # turn's new tokens are prefilled.
                assert out["timings"]["cache_n"] >= n_before, (turn, m)
    metrics = server.metrics()
    assert metrics["llamacpp:mind_new_total"] == N_MINDS
    assert metrics["llamacpp:mind_hits_ram_total"] >= N_MINDS
    assert metrics["llamacpp:page_failed_total"] == 0
    # /pages adds up: the store's count is the minds' RAM pages, the spare buffer switches copy
    # into, the anonymous cache and buffers being unmapped; nothing is left unexplained.
    pages = server.client.get("/pages").json()
    assert "mind-switch" in [s["purpose"] for s in pages["spares"]], pages
    assert pages["other_bytes"] == 0, pages


# One slot, so a mind in it is the slot's whole state.
ONE_SLOT_ARGS = ("-c", "2048", "-np", "1", "-t", "1", "-tb", "1", "--metrics")
KA, KB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}


def _ask(server: ServerProcess, prompt: str, headers: dict[str, str], **extra: Any) -> dict:
    body = {"prompt": prompt, "n_predict": 3, "temperature": 0, **extra}
    resp = server.post("/completion", body, headers=headers)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _slot0(server: ServerProcess, headers: dict[str, str]) -> dict[str, Any]:
    return dict(server.client.get("/slots", headers=headers).json()[0])


def _pages(server: ServerProcess, headers: dict[str, str]) -> dict[str, Any]:
    return dict(server.client.get("/pages", headers=headers).json())


@pytest.mark.timeout(300)
def test_slot_verbs_on_a_slot_holding_a_mind_act_on_the_mind(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    keys = ("--api-key", "ka,kb", "--slot-save-path", str(save))
    server = start(*ONE_SLOT_ARGS, *keys)
    prompt = chat_prompt(("system", _system(1, 8)), ("user", "Which box?"))
    zed = {**KA, "X-Mind-Id": "zed"}
    first = _ask(server, prompt, zed)
    n_tokens = first["timings"]["prompt_n"] + first["tokens_predicted"] - 1
    assert _slot0(server, KA)["mind"] == "zed"
    assert "mind" not in _slot0(server, KB)  # another key never sees the name

    # Another key's verbs never act on the mind, and never name it.
    for action in ("save", "erase", "page_out"):
        resp = server.post(
            f"/slots/0?action={action}&page=stolen", {"filename": "stolen.bin"}, headers=KB
        )
        assert resp.status_code == 403, (action, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "permission_error" and "zed" not in error["message"], action
    assert not (save / "stolen.bin").exists()
    assert _slot0(server, KA)["mind"] == "zed"

    # save writes the mind's state (the mind stays where it is).
    saved = server.post("/slots/0?action=save", {"filename": "zed.bin"}, headers=KA)
    assert saved.status_code == 200, saved.text
    assert saved.json()["n_saved"] == n_tokens and saved.json()["mind"] == "zed"
    assert _slot0(server, KA)["mind"] == "zed"

    # page_out pages it under the name given: the page is its state, the mind has left.
    moved = server.post("/slots/0?action=page_out&page=alice", headers=KA)
    assert moved.status_code == 200, moved.text
    assert moved.json()["n_tokens"] == n_tokens and moved.json()["mind"] == "zed"
    pages = _pages(server, KA)
    assert [p["name"] for p in pages["pages"]] == ["alice"]
    assert all(v["mind"] != "zed" for v in pages["minds"])
    assert "mind" not in _slot0(server, KA)
    back = server.post("/slots/0?action=page_in&page=alice", headers=KA)
    assert back.status_code == 200 and back.json()["n_tokens"] == n_tokens
    assert _ask(server, prompt, KA, id_slot=0)["timings"]["cache_n"] == len_prompt(first)

    ann = {**KA, "X-Mind-Id": "ann"}
    _ask(server, prompt, ann)
    server.stop()  # SIGTERM spills every mind: ann is on disk, zed (paged out) is not
    ann_file = save / _key("ka", "ann")
    assert ann_file.exists() and not (save / _key("ka", "zed")).exists()

    # The save restores into a fresh server with the mind's tokens.
    fresh = start(*ONE_SLOT_ARGS, *keys)
    restored = fresh.post("/slots/0?action=restore", {"filename": "zed.bin"}, headers=KA)
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == n_tokens
    again = _ask(fresh, prompt, KA, id_slot=0)
    assert again["timings"]["cache_n"] == len_prompt(first)
    assert again["content"] == first["content"]

    # erase erases the mind: its state in the slot and its copy on disk.
    assert _ask(fresh, prompt, ann)["timings"]["cache_n"] == len_prompt(first)  # from disk
    erased = fresh.post("/slots/0?action=erase", headers=KA)
    assert erased.status_code == 200, erased.text
    assert erased.json()["n_erased"] == n_tokens and erased.json()["mind"] == "ann"
    assert not ann_file.exists()
    assert all(v["mind"] != "ann" for v in _pages(fresh, KA)["minds"])
    n_new, n_disk = _mind_counts(fresh)
    _ask(fresh, prompt, ann)  # it starts anew, no tier holding it (its first turn may find its
    assert _mind_counts(fresh) == (n_new + 1, n_disk)  # prompt in ka's anonymous cache)


def _mind_counts(server: ServerProcess) -> tuple[float, float]:
    """(minds started anew, minds read back from disk), by ka's /metrics."""
    text = server.client.get("/metrics", headers=KA).text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in ("#", ""))
    return float(values["llamacpp:mind_new_total"]), float(values["llamacpp:mind_hits_disk_total"])


def len_prompt(out: dict[str, Any]) -> int:
    """The prompt tokens of a first turn (what a cache of its slot holds, but the last)."""
    return int(out["timings"]["prompt_n"] + out["timings"]["cache_n"]) - 1


def _key(api_key: str, name: str) -> str:
    """Where mind `name` of `api_key` is spilled, under the save path."""
    from kvswap.core.keys import mind_key, namespace_of
    from kvswap.tiers.mindfiles import MINDS_DIR, file_name

    return f"{MINDS_DIR}/{file_name(mind_key(namespace_of(api_key), name))}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("disk", [False, True], ids=["ram-only", "with-disk"])
def test_a_mind_larger_than_the_page_store_never_stops_other_requests(
    start: Callable[..., ServerProcess], tmp_path: Path, disk: bool
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    extra = ("--slot-save-path", str(save)) if disk else ()
    server = start(*ONE_SLOT_ARGS, "--page-ram-bytes", "4M", *extra)
    big = chat_prompt(("system", _system(2, 36)), ("user", "Which box?"))  # ~760 tokens
    out1 = _ask(server, big, {"X-Mind-Id": "big1"})
    n_big = out1["timings"]["prompt_n"]
    assert n_big > 700  # a state of ~17.5 MB: more than the whole page store
    # Another mind, then a request naming none: each takes the only slot.
    _ask(server, big.replace("Which box?", "Which shelf?"), {"X-Mind-Id": "big2"})
    _ask(server, chat_prompt(("user", "Hello!")), {})
    # The big mind answers again: read back from disk when there is one, else re-prefilled
    # (but for its first token, `<|im_start|>`, which the anonymous prompt the slot holds
    # shares: a new mind starts from its key's longest cached prefix).
    again = _ask(server, big, {"X-Mind-Id": "big1"})
    assert again["timings"]["cache_n"] == (n_big - 1 if disk else 1)
    assert again["content"] == out1["content"]
    metrics = server.metrics()
    assert metrics["llamacpp:mind_too_large_total"] >= 2
    log = server.log_path.read_text()
    assert log.count("more than the whole page store") == 2  # once per mind


@pytest.mark.timeout(600)
def test_minds_over_half_the_page_store_take_turns_with_no_refusal(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 32: minds over half of `--page-ram-bytes` switch with no refusal. Two minds of
    ~17.5 MB under a 24 MB store take turns on one slot: every turn answers and prefills only
    its new tokens, whichever tier each comes back from. (The refusal this guards against, a
    returning mind's RAM page and the outgoing page not both fitting, is a race with the
    demoter's spill here; `unit/test_seating.py` pins the decision: straight to disk.)"""
    server = start(*ONE_SLOT_ARGS, "--page-ram-bytes", "24M", save=tmp_path / "slots")
    minds = Minds(server, 2, n_facts=36)  # ~760 tokens, ~17.5 MB each
    for turn in range(4):
        for m in range(2):
            n_before = minds.n_prompt.get(m, 0)
            out = minds.turn(m, turn)
            if turn > 0:
                assert out["timings"]["cache_n"] >= n_before, (turn, m, out["timings"])
    assert "cannot make room" not in server.log_path.read_text()
    assert server.metrics()["llamacpp:page_failed_total"] == 0


@pytest.mark.timeout(600)
def test_a_budget_of_two_minds_keeps_the_other_mind_in_ram(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 32: the switch's spare buffer is the store's headroom, not a mind's worth beside
    it. Two minds of ~17.5 MB take turns on one slot under a 40 MB store: the mind out of the
    slot stays a RAM page (the demoter kept a free mind's room beside the spare, and spilled
    it to disk: every return was a read)."""
    server = start(*ONE_SLOT_ARGS, "--page-ram-bytes", "40M", save=tmp_path / "slots")
    minds = Minds(server, 2, n_facts=36)  # ~760 tokens, ~17.5 MB each
    for turn in range(4):
        for m in range(2):
            minds.turn(m, turn)
    metrics = server.metrics()
    assert metrics["llamacpp:mind_hits_ram_total"] == 6, metrics
    assert metrics["llamacpp:mind_hits_disk_total"] == 0
    assert metrics["llamacpp:mind_spills_total"] == 0


@pytest.mark.timeout(300)
def test_a_restart_with_other_kv_types_keeps_the_old_minds_files(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ONE_SLOT_ARGS, "-fa", "on", "--slot-save-path", str(save))
    prompt = chat_prompt(("system", _system(4, 6)), ("user", "Which box?"))
    first = start(*args)
    out = _ask(first, prompt, {"X-Mind-Id": "m1"})
    first.stop()  # SIGTERM: m1 is spilled, made with f16 KV
    path = save / _key("", "m1")
    before = path.read_bytes()

    other = start(*args, "-ctk", "q8_0", "-ctv", "q8_0")
    refused = other.post(
        "/completion", {"prompt": prompt, "n_predict": 3}, headers={"X-Mind-Id": "m1"}
    )
    assert refused.status_code == 400, refused.text
    assert "KV types f16/f16" in refused.json()["error"]["message"]
    _ask(other, prompt, {"X-Mind-Id": "m2"})  # other minds are served
    other.stop()
    assert path.read_bytes() == before  # never written over

    back = start(*args)  # the KV types it was made with: served again, whole
    again = _ask(back, prompt, {"X-Mind-Id": "m1"})
    assert again["timings"]["cache_n"] == len_prompt(out)


def _wait_for(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_idle_minds_reach_disk_on_schedule_so_a_sigkill_keeps_them(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ONE_SLOT_ARGS, "--slot-save-path", str(save), "--page-flush-seconds", "1")
    server = start(*args)
    prompts = {m: chat_prompt(("system", _system(5 + m, 6)), ("user", "Box?")) for m in (1, 2)}
    firsts = {m: _ask(server, prompts[m], {"X-Mind-Id": f"k{m}"}) for m in (1, 2)}
    # k1 is a RAM page now, k2 in the slot: neither has been written under RAM pressure.
    _wait_for(lambda: server.metrics()["llamacpp:mind_flushes_total"] >= 2)
    assert server.metrics()["llamacpp:mind_spills_total"] == 0
    server.stop(sig=signal.SIGKILL)

    again = start(*args)
    found = {v["mind"]: v["tier"] for v in _pages(again, {})["minds"]}
    assert found == {"k1": "disk", "k2": "disk"}
    for m in (1, 2):
        out = _ask(again, prompts[m], {"X-Mind-Id": f"k{m}"})
        assert out["timings"]["cache_n"] == len_prompt(firsts[m]), m


@pytest.mark.timeout(600)
def test_a_mind_grown_past_every_page_so_far_still_switches_in_a_full_store(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Issue 32 (the server wedged): a store holding two mind pages and the switch's spare,
    with a few hundred KB to spare, and a mind grown in its slot past every page so far. The
    switch needs a larger spare than the one it has; the demoter, sizing its headroom by the
    largest page seen, found it met and freed nothing, and the spare was asked again and again
    at the old size (a livelock: `bench minds --cases exceed` hung on its third later turn).
    The outgoing mind's size now counts before the switch waits: every turn is answered."""

    def turns(server: ServerProcess, rounds: range) -> Minds:
        minds = Minds(server, 3, n_facts=36)
        for turn in rounds:
            for m in range(3):
                minds.turn(m, turn)
        return minds

    roomy = start(*ONE_SLOT_ARGS, "--page-ram-bytes", "200M", save=tmp_path / "roomy")
    turns(roomy, range(1))
    sizes = [m["n_bytes"] for m in roomy.client.get("/pages").json()["minds"] if m["n_bytes"]]
    roomy.stop()
    assert len(sizes) == 2, sizes  # two pages in RAM, the third mind in the slot
    budget = sum(sizes) + max(sizes) + (256 << 10)  # grows past it in one turn
    tight = start(*ONE_SLOT_ARGS, "--page-ram-bytes", str(budget), save=tmp_path / "tight")
    turns(tight, range(3))  # every turn answered (at the parent: no answer, ever)
    assert tight.metrics()["llamacpp:mind_hits_disk_total"] > 0
