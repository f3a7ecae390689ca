"""An OS error injected at every step of a publication, and of a roll forward.

Each test first runs the operation with a counting hook to enumerate its OS steps, then, for
every step k, starts from a fresh save path and injects an `OSError` at step k, before the step
runs or after it ran. Afterwards a reader must see exactly the whole old generation or the whole
new one (the new one exactly when the commit record's rename happened), nothing staged may be
left once the reader ran (nor, for a failure before the commit point, right after the failure),
and nothing outside the save path may change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvswap.files import FilesError, OsAdapter, Publisher
from kvswap.files.faults import FailAt, StepCounter
from kvswap.files.osio import Phase

from .util import FINGERPRINT, GenSpec, assert_generation, stage_entries, tree

pytestmark = pytest.mark.timeout(120)

OLD = GenSpec("old", (".ckpt", ".dft"))
NEW = GenSpec("new", (".dft", ".lora"))


def _fresh(root: Path) -> tuple[Path, Path]:
    save, outside = root / "save", root / "outside"
    save.mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"never touched")
    return save, outside


def _visible(save: Path) -> dict[str, tuple[str, bytes]]:
    """The save path as a client sees it (kvswap's lock files aside)."""
    return {k: v for k, v in tree(save).items() if not k.startswith(".kvswap/lock")}


def _publish_steps(root: Path) -> tuple[list[tuple[str, str]], int]:
    save, _ = _fresh(root)
    counter = StepCounter()
    with Publisher(save, OsAdapter()) as pub:
        pub.publish("m", OLD.files(), FINGERPRINT)
    with Publisher(save, OsAdapter(counter)) as pub:
        counter.steps.clear()
        pub.publish("m", NEW.files(), FINGERPRINT)
        steps = list(counter.steps)
    commit = [
        i
        for i, (step, target) in enumerate(steps)
        if step == "replace" and target.startswith("record.json->")
    ]
    assert len(commit) == 1
    return [(str(s), t) for s, t in steps], commit[0]


def _names(spec: GenSpec) -> list[str]:
    return sorted([".kvswap", "m", *(f"m{s}" for s in spec.suffixes)])


@pytest.mark.parametrize("phase", ["before", "after"])
def test_error_at_every_publish_step(tmp_path: Path, phase: Phase) -> None:
    steps, commit_at = _publish_steps(tmp_path / "count")
    assert len(steps) > 40
    kinds = {s for s, _ in steps}
    assert {
        "open",
        "write",
        "fsync",
        "fsync_dir",
        "replace",
        "stat",
        "unlink",
        "mkdir",
        "rmdir",
        "flock",
    } <= kinds
    for k in range(len(steps)):
        save, outside = _fresh(tmp_path / f"{phase}-{k}")
        osio = OsAdapter()
        with Publisher(save, osio) as pub:
            pub.publish("m", OLD.files(), FINGERPRINT)
            before = _visible(save)
            outside_before = tree(outside)
            osio.hook = hook = FailAt(k, phase)
            with pytest.raises(FilesError) as info:
                pub.publish("m", NEW.files(), FINGERPRINT)
            osio.hook = None
            assert hook.fired, steps[k]
        committed = k > commit_at or (k == commit_at and phase == "after")
        assert info.value.committed is committed, (k, steps[k])
        if not committed:
            assert _visible(save) == before, (k, steps[k])  # untouched, nothing staged
            assert stage_entries(save) == [], (k, steps[k])
        with Publisher(save) as reader, reader.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, NEW if committed else OLD)
        assert stage_entries(save) == [], (k, steps[k])
        assert sorted(os.listdir(save)) == _names(NEW if committed else OLD), (k, steps[k])
        assert tree(outside) == outside_before
        assert sorted(os.listdir(save.parent)) == ["outside", "save"]


def _pending(save: Path, commit_at: int) -> None:
    """Leave a publication of NEW cut short right after its commit record's rename."""
    osio = OsAdapter()
    with Publisher(save, osio) as pub:
        pub.publish("m", OLD.files(), FINGERPRINT)
        osio.hook = FailAt(commit_at + 1)  # the commit folder's sync fails
        with pytest.raises(FilesError):
            pub.publish("m", NEW.files(), FINGERPRINT)
    assert len(stage_entries(save)) == 2  # the stage folder and its (released) lock file


def test_error_at_every_roll_forward_step(tmp_path: Path) -> None:
    _, commit_at = _publish_steps(tmp_path / "count")
    save, _ = _fresh(tmp_path / "count-read")
    _pending(save, commit_at)
    counter = StepCounter()
    with Publisher(save, OsAdapter(counter), recover=False) as pub:
        pub.read_generation("m", FINGERPRINT).close()
        n_steps = len(counter.steps)
    assert ("replace", "seq->m") in counter.steps
    for phase in ("before", "after"):
        for k in range(n_steps):
            save, outside = _fresh(tmp_path / f"read-{phase}-{k}")
            _pending(save, commit_at)
            outside_before = tree(outside)
            osio = OsAdapter(FailAt(k, phase))
            try:
                with Publisher(save, osio, recover=False) as pub:
                    pub.read_generation("m", FINGERPRINT).close()
            except FilesError:
                pass
            with Publisher(save) as reader, reader.read_generation("m", FINGERPRINT) as gen:
                assert_generation(gen, NEW)
            assert stage_entries(save) == []
            assert sorted(os.listdir(save)) == _names(NEW)
            assert tree(outside) == outside_before


def test_error_during_startup_recovery(tmp_path: Path) -> None:
    _, commit_at = _publish_steps(tmp_path / "count")
    for k in range(30):
        save, _ = _fresh(tmp_path / f"start-{k}")
        _pending(save, commit_at)
        hook = FailAt(k)
        try:
            Publisher(save, OsAdapter(hook)).close()
        except FilesError:
            assert hook.fired
        with Publisher(save) as reader, reader.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, NEW)
        assert stage_entries(save) == []
