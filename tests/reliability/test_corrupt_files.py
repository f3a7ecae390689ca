"""Damaged slot files and sidecars, through a real server: a typed error or a cold restore, never
a crash, never a byte outside the save path touched, never corrupted KV in any slot.

A hybrid tiny model (lfm2) writes `F` and `F.ckpt`. Each damaged variant is a committed
generation damaged in place (so its checksums no longer match), or a file put into the save path
by hand (no commit record, read as llama-server's format). After every restore attempt the
slot that received it and a bystander slot must still continue PROMPT_B exactly as a cold slot
does (greedy tokens), and the server must be alive.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from kvswap.files import seqfile
from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

ARGS = ("-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "-b", "32", "-ub", "32",
        "--checkpoint-min-step", "64")  # fmt: skip
# Byte tokens of the tiny vocabulary (ids 3..258), chosen in advance.
PROMPT_A = [3 + (i * 37) % 256 for i in range(400)]
PROMPT_B = PROMPT_A[:150] + [3 + (i * 11 + 5) % 256 for i in range(40)]
BYSTANDER = [3 + (i * 7 + 1) % 256 for i in range(120)]


def _run(server: ServerProcess, prompt: list[int], slot: int) -> dict:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "id_slot": slot}
    resp = server.post("/completion", body | {"return_tokens": True})
    assert resp.status_code == 200, resp.text
    return resp.json()


class Rig:
    """One server, its save path, and the outputs every check compares against."""

    def __init__(self, server: ServerProcess, save_dir: Path, outside: Path) -> None:
        self.server = server
        self.save_dir = save_dir
        self.outside = outside
        assert server.post("/slots/1?action=erase").status_code == 200
        self.expected_b = _run(server, PROMPT_B, slot=1)["tokens"]
        assert server.post("/slots/1?action=erase").status_code == 200
        self.expected_bystander = _run(server, BYSTANDER, slot=1)["tokens"]

    def save_good(self, name: str) -> None:
        assert self.server.post("/slots/0?action=erase").status_code == 200
        _run(self.server, PROMPT_A, slot=0)
        saved = self.server.post("/slots/0?action=save", {"filename": name})
        assert saved.status_code == 200, saved.text
        assert (self.save_dir / f"{name}.ckpt").exists()

    def restore_and_check(self, name: str) -> tuple[int, dict]:
        resp = self.server.post("/slots/0?action=restore", {"filename": name})
        body = resp.json()
        if resp.status_code != 200:
            err = body["error"]
            assert err["code"] == resp.status_code and resp.status_code in (400, 404), body
            assert err["type"] in ("invalid_request_error", "not_found_error"), body
        assert self.server.proc.poll() is None, self.server.log()
        # Whatever slot 0 now holds continues PROMPT_B as a cold slot does; slot 1 too.
        assert _run(self.server, PROMPT_B, slot=0)["tokens"] == self.expected_b
        by = _run(self.server, BYSTANDER, slot=1)
        assert by["tokens"] == self.expected_bystander and by["timings"]["cache_n"] > 0
        assert self.outside.read_bytes() == b"precious"
        return resp.status_code, body


@pytest.fixture(scope="module")
def rig(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Rig:
    root = tmp_path_factory.mktemp("corrupt")
    (root / "slots").mkdir()
    outside = root / "outside.bin"
    outside.write_bytes(b"precious")
    model = tiny_model_path("lfm2", seed=11)
    server = server_factory(
        "-m", str(model), *ARGS, "--slot-save-path", str(root / "slots"), fresh=True
    )
    return Rig(server, root / "slots", outside)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


F_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda d: b"",
    "magic only": lambda d: d[:4],
    "truncated header": lambda d: d[:10],
    "truncated half": lambda d: d[: len(d) // 2],
    "one byte short": lambda d: d[:-1],
    "one byte more": lambda d: d + b"\0",
    "flip in magic": lambda d: _flip(d, 1),
    "flip in token count": lambda d: _flip(d, 8),
    "flip in tokens": lambda d: _flip(d, 20),
    "flip in payload": lambda d: _flip(d, len(d) // 2),
    "flip in last byte": lambda d: _flip(d, len(d) - 1),
    "wrong version": lambda d: d[:4] + struct.pack("<I", 99) + d[8:],
    "oversized": lambda d: d + b"\xab" * (4 << 20),
}


@pytest.mark.parametrize("damage", list(F_DAMAGE))
def test_a_damaged_committed_f_is_refused(rig: Rig, damage: str) -> None:
    name = f"f-{damage.replace(' ', '-')}.bin"
    rig.save_good(name)
    path = rig.save_dir / name
    path.write_bytes(F_DAMAGE[damage](path.read_bytes()))
    status, body = rig.restore_and_check(name)
    assert status == 400, body


@pytest.mark.parametrize("damage", list(F_DAMAGE))
def test_a_damaged_ckpt_restores_cold(rig: Rig, damage: str) -> None:
    name = f"c-{damage.replace(' ', '-')}.bin"
    rig.save_good(name)
    path = rig.save_dir / f"{name}.ckpt"
    path.write_bytes(F_DAMAGE[damage](path.read_bytes()))
    status, body = rig.restore_and_check(name)
    assert status == 200 and body["n_restored"] > 0, body


@pytest.mark.parametrize("damage", ["empty", "truncated half", "flip in magic", "wrong version"])
def test_a_damaged_foreign_file_is_refused(rig: Rig, damage: str) -> None:
    """A file put into the save path by hand (no commit record) is read as llama-server's."""
    rig.save_good("source.bin")
    data = (rig.save_dir / "source.bin").read_bytes()
    name = f"foreign-{damage.replace(' ', '-')}.bin"
    (rig.save_dir / name).write_bytes(F_DAMAGE[damage](data))
    status, body = rig.restore_and_check(name)
    assert status == 400, body


def test_a_foreign_file_claiming_more_tokens_than_the_slot_holds_is_refused(rig: Rig) -> None:
    tokens = [3 + i % 256 for i in range(5000)]  # the slot's window is 2048
    (rig.save_dir / "too-long.bin").write_bytes(seqfile.encode_header(tokens) + b"\0" * 4096)
    status, body = rig.restore_and_check("too-long.bin")
    assert status == 400, body


def test_a_sparse_64_gib_file_is_refused_without_reading_it(rig: Rig) -> None:
    with open(rig.save_dir / "huge.bin", "wb") as f:
        f.write(seqfile.encode_header(PROMPT_A))
        f.truncate(64 << 30)
    status, body = rig.restore_and_check("huge.bin")
    assert status == 400, body
    assert psutil.Process(rig.server.proc.pid).memory_info().rss < 2 << 30


@pytest.fixture(scope="module")
def other_model_file(rig: Rig, server_factory: Callable[..., ServerProcess]) -> str:
    """`other.bin` (and its `.ckpt`), saved into the rig's save path by another model."""
    other = server_factory(
        "-m", str(tiny_model_path("lfm2", seed=12)), *ARGS,
        "--slot-save-path", str(rig.save_dir), fresh=True,
    )  # fmt: skip
    try:
        _run(other, PROMPT_A, slot=0)
        assert other.post("/slots/0?action=save", {"filename": "other.bin"}).status_code == 200
    finally:
        other.stop()
    assert (rig.save_dir / "other.bin.ckpt").exists()
    return "other.bin"


def test_a_file_from_another_model_is_refused(rig: Rig, other_model_file: str) -> None:
    status, body = rig.restore_and_check(other_model_file)
    assert status == 400, body


def test_a_ckpt_from_another_model_restores_cold(rig: Rig, other_model_file: str) -> None:
    rig.save_good("mixed.bin")
    foreign = (rig.save_dir / f"{other_model_file}.ckpt").read_bytes()
    (rig.save_dir / "mixed.bin.ckpt").write_bytes(foreign)
    status, body = rig.restore_and_check("mixed.bin")
    assert status == 200 and body["n_restored"] > 0, body


@pytest.mark.parametrize("page", ["..", "../x", "a/b", "/etc/passwd", "nul\x00", "x" * 256, ""])
def test_escaping_page_names_are_refused_and_the_slot_keeps_its_state(rig: Rig, page: str) -> None:
    _run(rig.server, PROMPT_A, slot=0)
    resp = rig.server.client.post("/slots/0", params={"action": "page_out", "page": page})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
    again = _run(rig.server, PROMPT_A, slot=0)
    assert again["timings"]["cache_n"] > 0  # nothing was taken from the slot
    rig.restore_and_check("no-such-file.bin")


@pytest.mark.parametrize("name", ["../spill.bin", "/tmp/spill.bin", "link.bin", "a\x00b.bin"])
def test_a_spill_to_an_escaping_filename_is_refused_and_the_page_stays(rig: Rig, name: str) -> None:
    link = rig.save_dir / "link.bin"
    if not link.is_symlink():
        link.symlink_to(rig.outside)
    _run(rig.server, PROMPT_A, slot=0)
    assert rig.server.post("/slots/0?action=page_out&page=keep").status_code == 200
    spill = rig.server.post("/slots/0?action=spill&page=keep", {"filename": name, "drop": True})
    assert spill.status_code == 400, spill.text
    assert spill.json()["error"]["type"] == "invalid_request_error"
    back = rig.server.post("/slots/0?action=page_in&page=keep")
    assert back.status_code == 200, back.text
    rig.restore_and_check("no-such-file.bin")
    assert not (rig.save_dir.parent / "spill.bin").exists()


@pytest.mark.parametrize(
    "name", ["../outside.bin", "/etc/passwd", "a\x00b.bin", "..", "sub/x.bin", "link.bin"]
)
def test_escaping_names_touch_nothing_outside(rig: Rig, name: str) -> None:
    link = rig.save_dir / "link.bin"
    if not link.is_symlink():
        link.symlink_to(rig.outside)
    _run(rig.server, PROMPT_A, slot=0)
    for action in ("save", "restore"):
        resp = rig.server.post(f"/slots/0?action={action}", {"filename": name})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["type"] == "invalid_request_error"
    status, _ = rig.restore_and_check(name)
    assert status == 400
    assert sorted(p.name for p in rig.save_dir.parent.iterdir()) == ["outside.bin", "slots"]
