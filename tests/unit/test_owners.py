"""Ownership of minds across servers sharing a save path (`files.owners`), and what the registry
forgets: a claim holds no descriptor, a dead owner's claim is taken over, and a mind that lives
nowhere leaves no entry behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from kvswap.core.keys import mind_key
from kvswap.engine.seats.registry import DiskCopy, MindRegistry
from kvswap.files.owners import OwnerLocks
from kvswap.files.types import META_DIR_NAME


def _save(tmp_path: Path) -> Path:
    (tmp_path / META_DIR_NAME).mkdir(exist_ok=True)
    return tmp_path


def _n_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_any_number_of_claims_holds_no_descriptor(tmp_path: Path) -> None:
    owners = OwnerLocks(_save(tmp_path))
    n_fds = _n_fds()
    claims = tmp_path / META_DIR_NAME / "owners"
    for i in range(2000):
        assert owners.own(f"m{i}")
    assert _n_fds() == n_fds and len(list(claims.glob("*.claim"))) == 2000
    for i in range(2000):
        owners.release(f"m{i}")
    assert not list(claims.glob("*.claim")) and not owners.owns("m0")
    owners.close()


def test_a_live_owner_keeps_its_name_and_a_released_one_is_free(tmp_path: Path) -> None:
    a, b = OwnerLocks(_save(tmp_path)), OwnerLocks(_save(tmp_path))
    assert a.own("mind") and not b.own("mind") and b.owned_elsewhere("mind")
    a.release("mind")
    assert not b.owned_elsewhere("mind") and b.own("mind") and not a.own("mind")
    b.close()  # closing releases every claim
    assert a.own("mind")
    a.close()


def test_a_killed_owners_claims_are_taken_over(tmp_path: Path) -> None:
    save = _save(tmp_path)
    child = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from kvswap.files.owners import OwnerLocks
        owners = OwnerLocks(Path({str(save)!r}))
        assert owners.own("mind")
        print("owned", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "owned"
        here = OwnerLocks(save)
        assert not here.own("mind")  # alive: refused
        proc.kill()
        proc.wait(30)
        assert here.own("mind")  # dead (SIGKILL): its flock went with it, so did its claim
        here.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_registry_forgets_a_mind_that_lives_nowhere() -> None:
    reg = MindRegistry()
    key = mind_key("ns", "m")
    in_ram: set[object] = set()
    reg.set_busy(key, True)
    reg.touch(key)
    assert not reg.forget_if_gone(key, in_ram.__contains__)  # a request holds it
    reg.set_busy(key, False)
    reg.record_disk(key, DiskCopy(10, 2, 0.0))
    assert not reg.forget_if_gone(key, in_ram.__contains__)  # on disk
    reg.forget_disk(key)
    in_ram.add(key)
    assert not reg.forget_if_gone(key, in_ram.__contains__)  # a RAM page
    in_ram.clear()
    reg.seated(key, 0)
    assert not reg.forget_if_gone(key, in_ram.__contains__)  # resident
    reg.unseated(key)
    assert reg.metrics()["mind_entries"] == 1
    assert reg.forget_if_gone(key, in_ram.__contains__)
    assert reg.metrics()["mind_entries"] == 0
