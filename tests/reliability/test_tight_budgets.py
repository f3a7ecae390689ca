"""Growing minds under tight budgets: no wedge, no refusal while a tier has room.

A page store smaller than the largest mind, or holding one or two, minds that grow by up to a
fifth of a slot a turn (so a mind often outgrows every page so far in one turn, the case that
once wedged the server), and several clients taking turns at once on fewer slots than minds,
so that most turns switch a mind in from RAM or disk while another goes out, and minds wait for
a slot while others move (a mind moved straight to disk while its turn waited was once served
as new). One configuration also caps the disk tier (`--page-disk-bytes` with
`--page-disk-drop-lru`): minds waiting for a slot hold their copies there.

Checks: every turn is answered within `TURN_TIMEOUT_S` (a wedged server answers nothing); no
turn is refused (RAM and disk have room, or the disk tier drops its least recently used mind);
a mind found holding state holds exactly its last turn's tokens, and one found new was dropped
by the capped disk tier, never elsewhere; afterwards every mind takes a turn alone, and no slot
is left busy.

CI runs `KVSWAP_TIGHT_S` = 20 seconds a configuration; a long run is
`KVSWAP_TIGHT_S=300 pytest -s tests/reliability/test_tight_budgets.py`.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvswap.tiny import tiny_model_path
from tests.reliability.soak import TOKEN_HI, TOKEN_LO, classify
from tests.server.harness import ServerProcess

DURATION_S = float(os.environ.get("KVSWAP_TIGHT_S", "20"))
pytestmark = [pytest.mark.model, pytest.mark.timeout(int(120 + 6 * DURATION_S))]

TURN_TIMEOUT_S = 60.0  # a turn here takes well under a second; a wedge takes forever
N_CTX_SLOT = 2048
MAX_GROWTH = 400  # tokens a turn may add
MAX_MIND = N_CTX_SLOT - MAX_GROWTH - 64  # past this a conversation starts over
# The tiny model's KV: 6 layers x 4 KV heads x 64 x (K and V) x f16.
KV_BYTES_PER_TOKEN = 6 * 4 * 64 * 2 * 2
BIG_MIND_BYTES = MAX_MIND * KV_BYTES_PER_TOKEN


@dataclass
class Mind:
    tokens: list[int]
    epoch: int = 0
    kv: int = 0  # tokens its KV holds after its last answered turn


@dataclass(frozen=True)
class Config:
    n_slots: int
    n_minds: int
    n_clients: int
    ram_minds: float  # --page-ram-bytes, in the largest minds' bytes
    disk_minds: float | None = None  # --page-disk-bytes likewise, with --page-disk-drop-lru

    def args(self, model: Path) -> list[str]:
        ram = int(self.ram_minds * BIG_MIND_BYTES)
        args = ["-m", str(model), "-c", str(N_CTX_SLOT * self.n_slots), "-np", str(self.n_slots),
                "-t", "1", "-tb", "1", "-b", "512", "-ub", "512", "--metrics",
                "--page-ram-bytes", str(ram)]  # fmt: skip
        if self.disk_minds is not None:
            disk = int(self.disk_minds * BIG_MIND_BYTES)
            args += ["--page-disk-bytes", str(disk), "--page-disk-drop-lru"]
        return args


class Turns:
    """Clients taking turns of `n_minds` growing minds; each mind is one client's at a time."""

    def __init__(self, server: ServerProcess, config: Config, seed: int) -> None:
        self.server = server
        self.config = config
        self.seed = seed
        self.minds = [Mind([]) for _ in range(config.n_minds)]
        self.free = list(range(config.n_minds))
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.n_turns = 0
        self.n_lost = 0  # minds found new after the capped disk tier dropped them

    def run(self, duration_s: float) -> None:
        stop = time.monotonic() + duration_s
        threads = [
            threading.Thread(target=self._client, args=(random.Random(self.seed + k), stop))
            for k in range(self.config.n_clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration_s + 2 * TURN_TIMEOUT_S)
        with httpx.Client(base_url=self.server.url, timeout=TURN_TIMEOUT_S) as client:
            rng = random.Random(self.seed - 1)
            for i in range(self.config.n_minds):
                self._turn(client, rng, i)

    def _client(self, rng: random.Random, stop: float) -> None:
        with httpx.Client(base_url=self.server.url, timeout=TURN_TIMEOUT_S) as client:
            while time.monotonic() < stop and not self.failures:
                with self.lock:
                    i = self.free.pop(rng.randrange(len(self.free)))
                try:
                    self._turn(client, rng, i)
                finally:
                    with self.lock:
                        self.free.append(i)

    def _turn(self, client: httpx.Client, rng: random.Random, i: int) -> None:
        mind = self.minds[i]
        if len(mind.tokens) > MAX_MIND:
            self.minds[i] = mind = Mind([], epoch=mind.epoch + 1)
        growth = [rng.randint(TOKEN_LO, TOKEN_HI) for _ in range(rng.randint(10, MAX_GROWTH))]
        prompt = mind.tokens + growth
        name = f"m{i}-{mind.epoch}"
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "mind": name}  # fmt: skip
        try:
            resp = client.post("/completion", json=body)
        except httpx.TimeoutException:
            self._fail(f"{name}: no answer in {TURN_TIMEOUT_S:.0f} s (wedged)")
            return
        if resp.status_code != 200:
            self._fail(f"{name}: refused, {classify(resp, resp.content)}: {resp.text[:300]}")
            return
        out = resp.json()
        tier = out["mind"]["tier_before"]
        if tier == "new" and mind.kv:
            if self.config.disk_minds is None:
                self._fail(f"{name}: lost its {mind.kv} tokens ({out['mind']})")
            with self.lock:
                self.n_lost += 1
        elif tier != "new" and out["timings"]["cache_n"] != mind.kv:
            self._fail(f"{name}: from {tier} held {out['timings']['cache_n']}, not {mind.kv}")
        mind.tokens = prompt + out["tokens"]
        mind.kv = len(mind.tokens) - 1
        with self.lock:
            self.n_turns += 1

    def _fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


CONFIGS = {
    "minds past the whole store": Config(n_slots=1, n_minds=5, n_clients=2, ram_minds=0.6),
    "one slot, two minds of RAM": Config(n_slots=1, n_minds=5, n_clients=3, ram_minds=2.1),
    "two slots, six minds": Config(n_slots=2, n_minds=6, n_clients=4, ram_minds=1.3),
    "a capped disk tier": Config(n_slots=1, n_minds=6, n_clients=3, ram_minds=1.7, disk_minds=2.5),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_growing_minds_in_tight_budgets_are_all_answered(
    name: str, server_factory: Callable[..., ServerProcess]
) -> None:
    config = CONFIGS[name]
    seed = int(os.environ.get("KVSWAP_TIGHT_SEED", "11")) + 7 * list(CONFIGS).index(name)
    model = tiny_model_path("llama", seed=5, n_embd=256, n_layer=6, n_head=4, n_head_kv=4)
    args = config.args(model)
    server = server_factory(*args, save_path=True, fresh=True)
    turns = Turns(server, config, seed)
    turns.run(DURATION_S)
    metrics = server.metrics()
    print(f"\n{name} ({' '.join(args[args.index('--page-ram-bytes') :])}): {turns.n_turns} "
          f"turns, {turns.n_lost} minds dropped by the disk tier, from RAM "
          f"{metrics['llamacpp:mind_hits_ram_total']:.0f}, from disk "
          f"{metrics['llamacpp:mind_hits_disk_total']:.0f}")  # fmt: skip
    assert not turns.failures, (turns.failures[:5], server.log()[-3000:])
    assert metrics["llamacpp:mind_hits_disk_total"] > 0  # the budgets were tight
    assert turns.n_lost <= metrics["llamacpp:mind_disk_dropped_total"]  # each one dropped
    assert not any(s["is_processing"] for s in server.client.get("/slots").json())
    server.stop()
