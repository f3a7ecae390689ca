"""SIGKILL a real server inside a publication, at a chosen step, and check that every restore
gives back exactly the generation that was committed.

Each round starts a server with the crash seam armed (`KVSWAP_KILL_AT_STEP=J:KIND`, see
`kvswap.files.faults`: the server SIGKILLs itself right after the J-th OS step of that kind) and
makes one publication of one kind:

- `save`: a slot saved to `saved.bin`;
- `page_out`: a slot paged out to RAM, then the page spilled to `paged.bin` (and dropped);
- `spill`: a slot paged out, paged into the other slot, paged out again, then spilled to
  `moved.bin` (kept in RAM);
- `mind`: mind `T` evicted from its slot by two other minds while RAM is held full by named
  pages, so the demoter spills it (the only publication of that server).

The chosen step (`POINTS`) lies before the commit point (the old generation must come back) or
after it (the new one must). The round checks that the kill landed inside the publication: the
request got no answer, the server died of SIGKILL, and a stage was left behind. A fresh server
without the seam then checks every name against the exact generation the ledger expects, by
content: a restore must hold exactly its tokens (a continuation reuses all of them and no more,
so an older or newer generation fails) and continue exactly as a replay of the same writes on a
cold slot (same batches, so the same bits); a mind must be found with exactly its tokens. That
server then writes the next round's old generation (new tokens for every write, from a seeded
RNG) and exits cleanly (SIGTERM spills mind `T`).

`KVSWAP_KILL_ROUNDS` (default 4, one per kind) sets the rounds: round r runs kind r % 4 at
point (5r + seed) % 9, so 36 rounds kill every kind at every point once; `KVSWAP_KILL_SEED`.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from kvswap.files import OsAdapter, Publisher
from kvswap.files.faults import KILL_AT_STEP_ENV, StepCounter
from kvswap.tiny import tiny_model_path
from tests.files.util import FINGERPRINT, GenSpec
from tests.server.harness import ServerProcess

N_ROUNDS = int(os.environ.get("KVSWAP_KILL_ROUNDS", "4"))
SEED = int(os.environ.get("KVSWAP_KILL_SEED", "0"))
pytestmark = [pytest.mark.model, pytest.mark.timeout(120 + 90 * N_ROUNDS)]

ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-b", "32", "-ub", "32",
        "--checkpoint-min-step", "32", "--cache-ram", "0")  # fmt: skip
ROOMY = ("--page-ram-bytes", "16M")
TIGHT_CEILING = 2 << 20  # the mind round's store: named pages fill most of it
N_PREDICT = 4
PROBE = [7, 8]  # the tokens a check appends to a generation
KINDS = ("save", "page_out", "spill", "mind")
FILE_OF = {"save": "saved.bin", "page_out": "paged.bin", "spill": "moved.bin"}
MIND = "T"


@dataclass(frozen=True)
class Point:
    """Die right after the `j`-th (0-based) OS step of kind `step` of the publication."""

    step: str
    j: int
    what: str


POINTS = (
    Point("write", 0, "F's first bytes staged"),
    Point("fsync", 0, "F staged and synced"),
    Point("fsync_dir", 0, "every file and the record staged, the stage synced"),
    Point("fsync_dir", 1, "the stage folder's name synced"),
    Point("replace", 0, "the commit record renamed into commit/ (the commit point)"),
    Point("fsync_dir", 2, "commit/ synced"),
    Point("replace", 1, "F renamed into the save path, its sidecar still staged"),
    Point("fsync_dir", 3, "the save path synced"),
    Point("rmdir", 0, "the stage folder removed, its lock file left"),
)


def _committed_at(tmp: Path) -> dict[Point, bool]:
    """Which points lie at or after the commit point, from a real publication of an F with a
    sidecar over an older generation (the shape of a hybrid model's slot file)."""
    tmp.mkdir()
    old, new = GenSpec("old", (".ckpt",)), GenSpec("new", (".ckpt",))
    with Publisher(tmp) as pub:
        pub.publish("m", old.files(), FINGERPRINT)
    counter = StepCounter()
    with Publisher(tmp, OsAdapter(counter)) as pub:
        counter.steps.clear()
        pub.publish("m", new.files(), FINGERPRINT)
    steps = counter.steps
    commit = next(i for i, (s, t) in enumerate(steps) if s == "replace" and "record" in t)
    out = {}
    for p in POINTS:
        at = [i for i, (s, _) in enumerate(steps) if s == p.step]
        assert len(at) > p.j, (p, steps)
        out[p] = at[p.j] >= commit
    return out


@dataclass(frozen=True)
class Write:
    """One generation as written: a prompt and the tokens generated after it."""

    prompt: list[int]
    generated: list[int]

    @property
    def kv(self) -> list[int]:
        """The tokens the slot's KV holds (the last generated token is not decoded yet)."""
        return self.prompt + self.generated[:-1]

    @property
    def text(self) -> list[int]:
        return self.prompt + self.generated


@dataclass
class Ledger:
    """Per file name (and for the mind): the committed generation, and this round's new one."""

    rng: random.Random
    committed: dict[str, Write] = field(default_factory=dict)
    n_kills: int = 0

    def tokens(self, n_lo: int = 36, n_hi: int = 64) -> list[int]:
        """Fresh byte tokens of the tiny vocabulary (ids 3..258)."""
        return [self.rng.randint(3, 258) for _ in range(self.rng.randint(n_lo, n_hi))]


Publish = Callable[[], httpx.Response]


def _complete(server: ServerProcess, prompt: list[int], **where: object) -> dict:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True}
    resp = server.post("/completion", body | where)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _write(server: ServerProcess, prompt: list[int], slot: int) -> Write:
    """A generation on `slot` computed from scratch (no cached prefix), so that a replay of it
    runs the same batches and computes the same bits."""
    return Write(prompt, _complete(server, prompt, id_slot=slot, cache_prompt=False)["tokens"])


def _ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


# -- the writes: each makes a generation and answers the publication that commits it ---------


def _save(server: ServerProcess, ledger: Ledger) -> tuple[Write, Publish]:
    write = _write(server, ledger.tokens(), slot=0)
    return write, lambda: server.post("/slots/0?action=save", {"filename": FILE_OF["save"]})


def _page_out(server: ServerProcess, ledger: Ledger) -> tuple[Write, Publish]:
    write = _write(server, ledger.tokens(), slot=0)
    moved = _ok(server.post("/slots/0?action=page_out&page=p"))
    assert moved["n_tokens"] == len(write.kv), moved
    body = {"filename": FILE_OF["page_out"], "drop": True}
    return write, lambda: server.post("/slots/0?action=spill&page=p", body)


def _spill(server: ServerProcess, ledger: Ledger) -> tuple[Write, Publish]:
    write = _write(server, ledger.tokens(), slot=1)
    _ok(server.post("/slots/1?action=page_out&page=q"))
    assert _ok(server.post("/slots/0?action=page_in&page=q"))["n_tokens"] == len(write.kv)
    _ok(server.post("/slots/0?action=page_out&page=q"))
    body = {"filename": FILE_OF["spill"], "drop": False}
    return write, lambda: server.post("/slots/0?action=spill&page=q", body)


def _mind_turn(server: ServerProcess, ledger: Ledger) -> Write:
    """A turn of mind T: its committed text, then new tokens; the mind must be found holding
    exactly its committed generation's tokens (all reused, and no more)."""
    old = ledger.committed.get(MIND)
    prompt = (old.text if old else []) + ledger.tokens(8, 16)
    out = _complete(server, prompt, mind=MIND)
    assert out["timings"]["cache_n"] == (len(old.kv) if old else 0), (out["timings"], old)
    return Write(prompt, out["tokens"])


def _mind_demoted(server: ServerProcess, ledger: Ledger) -> tuple[Write, Publish]:
    """Hold the store near its ceiling with named pages, then make T an idle RAM page (two
    other minds take the slots): the demoter must spill T to keep its headroom."""
    for i in range(64):
        if _ok(server.client.get("/pages"))["n_bytes"] >= 0.8 * TIGHT_CEILING:
            break
        _complete(server, ledger.tokens(600, 700), id_slot=0)
        _ok(server.post(f"/slots/0?action=page_out&page=ballast{i}"))
    write = _mind_turn(server, ledger)
    _complete(server, ledger.tokens(), mind="X")
    return write, lambda: server.post(
        "/completion", {"prompt": [5, 6], "n_predict": 1, "mind": "Y"}
    )


WRITERS = {"save": _save, "page_out": _page_out, "spill": _spill, "mind": _mind_demoted}


# -- the checks ---------------------------------------------------------------------------


def _check_file(server: ServerProcess, name: str, expected: Write) -> None:
    """`name` restores exactly `expected`, and continues as a replay of it on a cold slot."""
    restored = _ok(server.post("/slots/0?action=restore", {"filename": name}))
    assert restored["n_restored"] == len(expected.kv), (name, restored)
    probe = {"prompt": [*expected.kv, *PROBE], "n_predict": N_PREDICT, "temperature": 0}
    warm = _ok(server.post("/completion", probe | {"id_slot": 0, "return_tokens": True}))
    assert warm["timings"]["cache_n"] == len(expected.kv), (name, warm["timings"])
    _ok(server.post("/slots/1?action=erase"))
    replay = _write(server, expected.prompt, slot=1)
    assert replay == expected, "a replay must compute the same tokens (same batches, one slot)"
    cold = _ok(server.post("/completion", probe | {"id_slot": 1, "return_tokens": True}))
    assert cold["timings"]["cache_n"] == len(expected.kv)
    assert warm["tokens"] == cold["tokens"], name


def _stage_entries(save_dir: Path) -> list[str]:
    return sorted(p.name for p in (save_dir / ".kvswap" / "stage").iterdir())


@dataclass
class Rig:
    """Servers on one save path, and the ledger of what each name must restore."""

    factory: Callable[..., ServerProcess]
    save_dir: Path
    ledger: Ledger

    def server(self, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
        model = str(tiny_model_path("lfm2", seed=11))
        return self.factory(
            "-m", model, *ARGS, *extra, "--slot-save-path", str(self.save_dir), fresh=True, env=env
        )

    def check_and_prepare(self, kind: str) -> None:
        """A clean server: every name holds its committed generation; then a new committed
        generation for the next round's `kind` (and for every name on the first call)."""
        server = self.server(*ROOMY)
        assert _stage_entries(self.save_dir) == [], "a cut publication survived the restart"
        committed = self.ledger.committed
        for name, write in sorted(committed.items()):
            if name != MIND:
                _check_file(server, name, write)
        first = not committed
        for k in KINDS[:3] if first else (kind,) if kind in FILE_OF else ():
            write, publish = WRITERS[k](server, self.ledger)
            _ok(publish())
            committed[FILE_OF[k]] = write
        # T's turn checks what it was found with; SIGTERM then spills it (its new generation).
        committed[MIND] = _mind_turn(server, self.ledger)
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM), server.log()

    def kill_inside(self, kind: str, point: Point, committed_after: bool) -> None:
        """A server armed to die at `point` makes one publication of `kind`."""
        env = {KILL_AT_STEP_ENV: f"{point.j}:{point.step}"}
        ceiling = ("--page-ram-bytes", str(TIGHT_CEILING)) if kind == "mind" else ROOMY
        server = self.server(*ceiling, env=env)
        write, publish = WRITERS[kind](server, self.ledger)
        try:
            answer: httpx.Response | None = publish()
        except httpx.TransportError:
            answer = None  # the server died while answering
        if kind != "mind":  # (the demoter's spill runs after the request that caused it)
            assert answer is None, f"the publication answered {answer.status_code}: no kill"
        try:
            code = server.proc.wait(60)
        except Exception as err:
            raise AssertionError(f"no kill at {point}:\n{server.log()}") from err
        assert code == -signal.SIGKILL, (code, server.log())
        assert _stage_entries(self.save_dir), f"the kill at {point} left no cut publication"
        self.ledger.n_kills += 1
        if committed_after:
            self.ledger.committed[MIND if kind == "mind" else FILE_OF[kind]] = write


def test_every_restore_after_a_kill_inside_a_publication_is_the_committed_generation(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    committed_at = _committed_at(tmp_path / "steps")
    assert [committed_at[p] for p in POINTS] == [False] * 4 + [True] * 5
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    rig = Rig(server_factory, save_dir, Ledger(random.Random(SEED)))
    rounds = [(KINDS[r % 4], POINTS[(5 * r + SEED) % len(POINTS)]) for r in range(N_ROUNDS)]
    rig.check_and_prepare(rounds[0][0])
    for r, (kind, point) in enumerate(rounds):
        after = committed_at[point]
        print(f"round {r}: {kind} killed after {point.step} #{point.j} ({point.what}): "
              f"{'new' if after else 'old'} generation expected")  # fmt: skip
        rig.kill_inside(kind, point, after)
        rig.check_and_prepare(rounds[(r + 1) % N_ROUNDS][0])
    print(f"{rig.ledger.n_kills} kills inside publications, every restore exact")
    assert rig.ledger.n_kills == N_ROUNDS
