"""Real processes killed with SIGKILL during a publication, and two processes racing.

The child (`crash_child.py`) is started with `subprocess` (never a fork). After each kill, a
fresh reader must restore exactly the whole old or the whole new generation (the new one
exactly when the kill came after the commit record's rename) and leave nothing staged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvswap.files import OsAdapter, Publisher
from kvswap.files.faults import StepCounter

from .util import (
    BIG_TAG,
    FINGERPRINT,
    NEW_SPEC,
    OLD_SPEC,
    GenSpec,
    assert_generation,
    spec_for_tag,
    stage_entries,
    tag_of,
    tree,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHILD = Path(__file__).with_name("crash_child.py")


def _child(save: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    src = str(Path(__file__).parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(save), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _fresh(root: Path) -> tuple[Path, Path]:
    save, outside = root / "save", root / "outside"
    save.mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"never touched")
    with Publisher(save) as pub:
        pub.publish("m", OLD_SPEC.files(), FINGERPRINT)
    return save, outside


def _steps(root: Path) -> tuple[int, int]:
    """Number of OS steps of the child's publication, and the index of the commit point."""
    save, _ = _fresh(root)
    counter = StepCounter()
    with Publisher(save, OsAdapter()) as pub:
        pub._osio.hook = counter  # as the child installs it: after construction
        pub.publish("m", NEW_SPEC.files(), FINGERPRINT)
        steps = list(counter.steps)
    commit = [i for i, (s, t) in enumerate(steps) if s == "replace" and t.startswith("record.json")]
    return len(steps), commit[0]


def test_sigkill_after_every_step(tmp_path: Path) -> None:
    n_steps, commit_at = _steps(tmp_path / "count")
    for k in range(n_steps):
        save, outside = _fresh(tmp_path / f"k{k}")
        outside_before = tree(outside)
        child = _child(save, "kill_at", str(k))
        _, err = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, (k, err)
        expected = NEW_SPEC if k >= commit_at else OLD_SPEC
        with Publisher(save) as reader, reader.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, expected)
        assert stage_entries(save) == [], k
        assert sorted(os.listdir(save)) == sorted(
            [".kvswap", "m", *(f"m{s}" for s in expected.suffixes)]
        )
        assert tree(outside) == outside_before


def test_sigkill_mid_write_of_a_large_file(tmp_path: Path) -> None:
    n_payload = 48 << 20
    big = GenSpec(BIG_TAG, (".dft",), n_payload=n_payload)
    outcomes = []
    for i, delay_s in enumerate((0.0, 0.002, 0.01, 0.03, 0.08, 0.2, 0.5)):
        save, _ = _fresh(tmp_path / f"d{i}")
        child = _child(save, "big", str(n_payload))
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "writing\n", child.communicate()
        time.sleep(delay_s)
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=60)
        with Publisher(save) as reader, reader.read_generation("m", FINGERPRINT) as gen:
            tag = tag_of(gen)
            assert_generation(gen, big if tag == BIG_TAG else OLD_SPEC)
        assert stage_entries(save) == []
        outcomes.append((delay_s, "done" in out, tag))
    assert outcomes[0][2] == "old", outcomes  # killed while writing: the old generation


def test_two_processes_publish_one_name(tmp_path: Path) -> None:
    save, _ = _fresh(tmp_path / "race")
    n_each = 12
    children = [_child(save, "loop", str(w), str(n_each)) for w in (0, 1)]
    seen: set[str] = set()
    with Publisher(save) as reader:
        while any(c.poll() is None for c in children):
            with reader.read_generation("m", FINGERPRINT) as gen:
                tag = tag_of(gen)
                assert_generation(gen, spec_for_tag(tag))
                seen.add(tag)
        for c in children:
            _, err = c.communicate(timeout=60)
            assert c.returncode == 0, err
        with reader.read_generation("m", FINGERPRINT) as gen:
            assert tag_of(gen) in (f"w0-{n_each - 1}", f"w1-{n_each - 1}")
            assert_generation(gen, spec_for_tag(tag_of(gen)))
    assert stage_entries(save) == []
    assert {t[:2] for t in seen} >= {"w0", "w1"}, seen  # both writers' generations read
