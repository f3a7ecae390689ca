"""Tenants through a real server with `--api-key ka,kb`: no route lets kb save over, restore,
spill, list, page in or probe ka's mind or pages; and any number of mind names costs bounded
open files and memory.

Each test failed on the tree before tenant isolation (b3e44a1^): kb listed ka's minds in
/pages, `save` with the mind's file name overwrote it, and every distinct mind name held an
open descriptor, so 5,000 names ran the server out of files.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kvswap.core.keys import mind_key, namespace_of
from kvswap.engine.seats.registry import ENTRY_BYTES
from kvswap.tiers.mindfiles import MINDS_DIR, file_name
from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

KA, KB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "64", "--metrics")
PROMPT = "Once upon a time there was a lighthouse keeper who counted the waves. " * 3


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def get(*args: str) -> ServerProcess:
        model = tiny_model_path("llama", seed=7, vocab="tiny")
        server = ServerProcess(["-m", str(model), *args], tmp_path / f"s{len(started)}.log")
        started.append(server)
        return server

    yield get
    for server in started:
        server.stop()


def _turn(server: ServerProcess, headers: dict[str, str], prompt: str, **extra: Any) -> dict:
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, **extra}
    resp = server.post("/completion", body, headers=headers)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _digest(folder: Path) -> dict[str, str]:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_another_keys_mind_and_pages_are_out_of_reach_on_every_route(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ARGS, "--page-ram-bytes", "32M", "--api-key", "ka,kb", "--slot-save-path", str(save))
    first = start(*args)
    alice = _turn(first, KA, PROMPT, mind="alice")
    first.stop()  # SIGTERM spills every mind: alice is now a file of the minds' folder
    server = start(*args)
    ns_a = namespace_of("ka")
    key = mind_key(ns_a, "alice")
    minds = save / MINDS_DIR
    assert (minds / file_name(key)).is_file()
    before = _digest(minds)

    # Listing: kb sees none of ka's minds or pages; ka sees its own.
    assert server.client.get("/pages", headers=KB).json()["minds"] == []
    mine = server.client.get("/pages", headers=KA).json()["minds"]
    assert [(m["mind"], m["tier"]) for m in mine] == [("alice", "disk")]

    # Slot files: every name that could reach the mind's file is refused or misses it.
    hexname = b"alice".hex()
    names = [
        f"mind~{ns_a}~{hexname}",  # the name an earlier version gave it
        file_name(key),  # its name in the minds' folder
        MINDS_DIR,
        f"{MINDS_DIR}/{file_name(key)}",
        f"../slots/{MINDS_DIR}/{file_name(key)}",
    ]
    for name in names:
        restored = server.post("/slots/1?action=restore", {"filename": name}, headers=KB)
        assert restored.status_code in (400, 404), (name, restored.text)  # nothing to restore
    _turn(server, KB, "kb writes its own slot " * 8, id_slot=0)
    for name in names:
        saved = server.post("/slots/0?action=save", {"filename": name}, headers=KB)
        assert saved.status_code in (200, 400), (name, saved.text)
    # Pages: a page name is kb's own page, whatever it looks like.
    for page in ("alice", f"mind~{ns_a}~{hexname}", file_name(key)):
        for verb in ("page_in", "page_drop"):
            resp = server.post(f"/slots/0?action={verb}&page={page}", headers=KB)
            assert resp.status_code == 404, (verb, page, resp.text)
        spill = server.post(
            f"/slots/0?action=spill&page={page}", {"filename": names[1]}, headers=KB
        )
        assert spill.status_code == 404, (page, spill.text)
    assert _digest(minds) == before  # nothing kb did touched ka's mind's files
    # A client page of one name is each tenant's own.
    assert server.post("/slots/0?action=page_out&page=p", headers=KB).status_code == 200
    assert server.post("/slots/0?action=page_in&page=p", headers=KA).status_code == 404
    assert [p["name"] for p in server.client.get("/pages", headers=KB).json()["pages"]] == ["p"]
    assert server.client.get("/pages", headers=KA).json()["pages"] == []

    # ka's alice comes back whole from disk: only its new tokens are prefilled.
    prompt = PROMPT + alice["content"]
    again = _turn(server, KA, prompt, mind="alice")
    assert again["timings"]["cache_n"] >= alice["tokens_evaluated"]
    # Probes: a reconfigure that leaves alice a page, /metrics and /slots name none of it.
    _turn(server, KB, "kb again " * 8, id_slot=0)
    receipt = server.post("/reconfigure", {"n_parallel": 1}, headers=KB)
    assert receipt.status_code == 200, receipt.text
    assert "paged" in {f["fate"] for f in receipt.json()["slots"]}
    for text in (
        receipt.text,
        server.client.get("/metrics", headers=KB).text,
        server.client.get("/slots", headers=KB).text,
    ):
        assert "alice" not in text and hexname not in text and ns_a not in text
    # A mind of the same name under kb is kb's own, new mind.
    other = _turn(server, KB, PROMPT, mind="alice")
    assert other["timings"]["cache_n"] == 0
    follow = _turn(server, {**KB, "X-Mind-Id": "alice"}, PROMPT + other["content"])
    assert follow["timings"]["cache_n"] >= other["tokens_evaluated"]  # kb's alice, continued
    last = _turn(server, KA, prompt + again["content"], mind="alice")
    assert last["timings"]["cache_n"] >= again["tokens_evaluated"]  # ka's, untouched


def test_minds_left_under_their_old_names_move_once_into_the_minds_folder(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    args = (*ARGS, "--page-ram-bytes", "32M", "--slot-save-path", str(save))
    key = mind_key(namespace_of(""), "alice")
    old = f"mind~{key.namespace}~{b'alice'.hex()}"  # an earlier version's mind file
    first = start(*args)
    alice = _turn(first, {}, PROMPT, id_slot=0)
    # The same bytes an earlier version spilled for mind alice: a generation under its name.
    assert first.post("/slots/0?action=save", {"filename": old}).status_code == 200
    first.stop()
    server = start(*args)
    assert "moved 1 mind(s)" in server.log_path.read_text()
    assert not (save / old).exists() and (save / MINDS_DIR / file_name(key)).is_file()
    mine = server.client.get("/pages").json()["minds"]
    assert [(m["mind"], m["tier"]) for m in mine] == [("alice", "disk")]
    again = _turn(server, {}, PROMPT + alice["content"], mind="alice")
    assert again["timings"]["cache_n"] >= alice["tokens_evaluated"]
    server.stop()
    assert "moved" not in start(*args).log_path.read_text()  # once


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(900)
def test_5000_mind_names_leave_open_files_and_memory_bounded(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    page_ram = 8 << 20
    server = start(*ARGS, "--page-ram-bytes", str(page_ram), "--slot-save-path", str(save))
    proc = psutil.Process(server.proc.pid)
    proc.rlimit(psutil.RLIMIT_NOFILE, (512, 512))  # a descriptor per name would run out
    for i in range(20):  # warm up: every code path, the spare buffers, the demoter
        _turn(server, {}, f"warm {i} " * 4, mind=f"warm-{i}", n_predict=1)
    fds0, rss0 = _open_files(proc.pid), proc.memory_info().rss
    n_names, errors, lock = 5000, [], threading.Lock()

    def client(part: int) -> None:
        for i in range(part, n_names, 4):
            body = {"prompt": f"name {i} says hi", "n_predict": 1, "mind": f"m-{i}"}
            resp = server.post("/completion", body)
            if resp.status_code != 200:
                with lock:
                    errors.append(resp.text)

    threads = [threading.Thread(target=client, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    peak_fds = fds0
    while any(t.is_alive() for t in threads):
        peak_fds = max(peak_fds, _open_files(proc.pid))
        threads[0].join(0.2)
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    # Open files: no descriptor per name (4 client sockets and a claim being written at most).
    assert peak_fds <= fds0 + 16, (fds0, peak_fds)
    owners = save / ".kvswap-minds" / ".kvswap" / "owners"
    claims = list(owners.glob("*.claim")) if owners.exists() else []
    assert len(claims) <= 64, len(claims)  # only minds live in a slot or RAM are claimed
    # Memory: the page budget plus the registry's stated bookkeeping per mind, and a fixed
    # allowance for the allocator's own growth (measured: about 6 MiB here).
    grown = proc.memory_info().rss - rss0
    print(f"\n5000 names: open files {fds0} -> peak {peak_fds}, {len(claims)} claims, "
          f"RSS +{grown / 2**20:.1f} MiB")  # fmt: skip
    assert grown <= page_ram + n_names * ENTRY_BYTES + (16 << 20), grown
    pages = server.client.get("/pages").json()
    assert len(pages["minds"]) >= n_names  # every mind still served: they hold state
    server.stop(sig=9)  # (a SIGTERM would spill every mind still in RAM first)


def test_pages_explain_every_charged_byte_to_a_lone_tenant(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*ARGS, "--page-ram-bytes", "32M")
    for m in range(3):  # three minds on two slots: switches prepare the spare buffer
        _turn(server, {}, f"mind {m} " * 10, mind=f"m{m}")
    _turn(server, {}, "an anonymous prompt " * 10)
    deadline = time.monotonic() + 20
    while True:
        pages = server.client.get("/pages").json()
        if any(s["purpose"] == "mind-switch" for s in pages["spares"]):
            break
        assert time.monotonic() < deadline, pages
        time.sleep(0.05)
    assert pages["other_bytes"] == 0, pages  # every byte is a listed page, mind or spare


def test_each_key_has_slot_files_of_its_own(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Audit B4: slot files were one folder for every key: kb could save over ka's file (its
    state lost) or restore it (its token count, and a prefix oracle on ka's conversation).
    With API keys each key's files are its own; a key-less server keeps llama-server's
    layout (the save path itself)."""
    save = tmp_path / "slots"
    save.mkdir()
    server = start(*ARGS, "--api-key", "ka,kb", "--slot-save-path", str(save))
    _turn(server, KA, PROMPT, id_slot=0)
    saved = server.post("/slots/0?action=save", {"filename": "notes.bin"}, headers=KA)
    assert saved.status_code == 200, saved.text
    n_ka = saved.json()["n_saved"]
    probe = server.post("/slots/1?action=restore", {"filename": "notes.bin"}, headers=KB)
    assert probe.status_code == 404, probe.text  # kb has no such file
    _turn(server, KB, "kb writes its own words " * 6, id_slot=0)
    mine = server.post("/slots/0?action=save", {"filename": "notes.bin"}, headers=KB)
    assert mine.status_code == 200 and mine.json()["n_saved"] != n_ka
    back = server.post("/slots/1?action=restore", {"filename": "notes.bin"}, headers=KA)
    assert back.status_code == 200 and back.json()["n_restored"] == n_ka  # ka's, untouched
    assert not (save / "notes.bin").exists()
