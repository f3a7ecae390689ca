"""SIGKILL a real server at random points of a workload that saves, pages out, pages in and
spills; on restart every generation committed before the kill restores whole, and nothing
half-written is ever read.

A workload thread drives one server (a hybrid tiny model, so files carry `.ckpt` sidecars) and
records, per file name, the generation a 200 answered for (committed) and the one still in
flight when the server died (either may be on disk). After each kill a fresh server on the same
save path restores every name: the restore must succeed (a name never answered may be 404)
with exactly one of those generations' token counts, and a continuation on the restored slot
must reuse all of it and equal a cold slot's tokens. `KVSWAP_KILL_ROUNDS` (default 3) sets the
kills; the kill delays come from a seeded RNG (`KVSWAP_KILL_SEED`) printed with each round.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from kvswap.files import seqfile
from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

N_ROUNDS = int(os.environ.get("KVSWAP_KILL_ROUNDS", "3"))
SEED = int(os.environ.get("KVSWAP_KILL_SEED", "1234"))
ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-b", "32", "-ub", "32",
        "--checkpoint-min-step", "32", "--page-ram-bytes", "16M")  # fmt: skip
FILES = ("m0.bin", "m1.bin", "m2.bin")


def prompt(i: int) -> list[int]:
    """Byte tokens of the tiny vocabulary (ids 3..258), chosen in advance."""
    return [3 + (i * 31 + j * 17) % 256 for j in range(40 + 9 * (i % 7))]


@dataclass
class Ledger:
    """What the workload knows about each file name: n_saved of the generation a 200 answered
    for, and of the one in flight (sent, no answer yet)."""

    committed: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    n_ops: int = 0


def _generate(client: httpx.Client, i: int, slot: int) -> int:
    body = {"prompt": prompt(i), "n_predict": 6, "temperature": 0, "id_slot": slot}
    out = client.post("/completion", json=body).json()
    return int(out["tokens_evaluated"] + out["tokens_predicted"] - 1)


def _write(client: httpx.Client, ledger: Ledger, n_tokens: int, path: str, name: str) -> None:
    """POST a save or spill writing file `name`; the ledger learns of it before and after."""
    ledger.in_flight[name] = n_tokens
    resp = client.post(
        path, json={"filename": name, "drop": True} if "spill" in path else {"filename": name}
    )
    assert resp.status_code == 200, resp.text
    ledger.committed[name] = n_tokens
    del ledger.in_flight[name]
    ledger.n_ops += 1


def workload(
    url: str, ledger: Ledger, start: int, stop: threading.Event, failures: list[BaseException]
) -> None:
    """Save, page out, page in and spill until the server dies (a transport error)."""
    try:
        _work(url, ledger, start, stop)
    except BaseException as err:
        failures.append(err)


def _work(url: str, ledger: Ledger, start: int, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        i = start
        try:
            while not stop.is_set():
                slot = i % 2
                n = _generate(client, i, slot)
                name = FILES[i % len(FILES)]
                if i % 3 == 0:
                    _write(client, ledger, n, f"/slots/{slot}?action=save", name)
                else:
                    page = f"p{i}"
                    moved = client.post(f"/slots/{slot}?action=page_out&page={page}")
                    assert moved.status_code == 200, moved.text
                    if i % 3 == 1:
                        back = client.post(f"/slots/{1 - slot}?action=page_in&page={page}")
                        assert back.status_code == 200, back.text
                        moved = client.post(f"/slots/{1 - slot}?action=page_out&page={page}")
                        assert moved.status_code == 200, moved.text
                    _write(client, ledger, n, f"/slots/0?action=spill&page={page}", name)
                i += 1
        except httpx.TransportError:
            return  # the server was killed


def check_restores(server: ServerProcess, ledger: Ledger) -> None:
    for name in FILES:
        allowed = {n for n in (ledger.committed.get(name), ledger.in_flight.get(name)) if n}
        resp = server.post("/slots/0?action=restore", {"filename": name})
        if not allowed:
            assert resp.status_code == 404, resp.text
            continue
        if name not in ledger.committed and resp.status_code == 404:
            continue  # its first write was cut short before its commit record
        assert resp.status_code == 200, (name, resp.text)
        n_restored = resp.json()["n_restored"]
        assert n_restored in allowed, (name, n_restored, allowed)
        # The same generation is now the committed one, whichever it was.
        ledger.committed[name] = n_restored
        ledger.in_flight.pop(name, None)
        _assert_continues_like_a_cold_slot(server, name, n_restored)


def _assert_continues_like_a_cold_slot(server: ServerProcess, name: str, n_restored: int) -> None:
    """Slot 0 holds the restored generation: continuing its tokens (read from the file's GGSQ
    header) must reuse every one and give a cold slot's greedy tokens."""
    save_dir = Path(server.args[server.args.index("--slot-save-path") + 1])
    toks = [int(t) for t in seqfile.parse_file((save_dir / name).read_bytes()).tokens]
    assert len(toks) == n_restored
    body = {"prompt": [*toks, 7], "n_predict": 4, "temperature": 0, "return_tokens": True}
    warm = server.post("/completion", body | {"id_slot": 0}).json()
    assert warm["timings"]["cache_n"] == n_restored, (name, warm["timings"])
    assert server.post("/slots/1?action=erase").status_code == 200
    cold = server.post("/completion", body | {"id_slot": 1}).json()
    assert cold["timings"]["cache_n"] == 0
    assert warm["tokens"] == cold["tokens"], name


def test_committed_generations_survive_sigkill(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    model = str(tiny_model_path("lfm2", seed=11))
    rng = random.Random(SEED)
    ledger = Ledger()
    start = 0
    for round_ in range(N_ROUNDS):
        server = server_factory("-m", model, *ARGS, "--slot-save-path", str(save_dir), fresh=True)
        check_restores(server, ledger)
        delay_s = rng.uniform(0.3, 4.0)
        print(f"round {round_}: kill after {delay_s:.2f} s (seed {SEED})")
        stop = threading.Event()
        failures: list[BaseException] = []
        t = threading.Thread(target=workload, args=(server.url, ledger, start, stop, failures))
        t.start()
        time.sleep(delay_s)
        server.stop(signal.SIGKILL)
        stop.set()
        t.join(60)
        assert not t.is_alive() and not failures, failures
        start += 1000
    final = server_factory("-m", model, *ARGS, "--slot-save-path", str(save_dir), fresh=True)
    check_restores(final, ledger)
    print(f"{N_ROUNDS} kills, {ledger.n_ops} committed writes, names {sorted(ledger.committed)}")
    assert ledger.n_ops > 0
