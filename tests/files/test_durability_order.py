"""The durability order of one publication, pinned step by step.

SIGKILL keeps the page cache, so the crash tests cannot see a missing fsync: only a power cut
would. This test records the OS steps of a real publication (every call goes through
`osio.OsAdapter`, the one OS adapter; a subclass here resolves each descriptor to the path it was
opened as) and asserts the order a power cut needs:

- every staged file (F, each sidecar, the record) is synced after its last write and before
  the record's rename into `commit/` (the commit point);
- the stage folder and `stage/` itself are synced before the commit point;
- `commit/` is synced after the commit point and before the first rename into the save path;
- the save path is synced after the last rename into it and the retired sidecar's unlink, and
  before the stage folder is removed.

Dropping any one fsync of `stage.py` or `commits.py` fails it (checked by deleting each in turn).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.files import OsAdapter, Publisher
from kvswap.files.paths import name_key

from .util import FINGERPRINT, GenSpec

pytestmark = pytest.mark.timeout(60)

OLD = GenSpec("old", (".ckpt", ".dft"))
NEW = GenSpec("new", (".dft", ".lora"))  # retires .ckpt
STAGE = ".kvswap/stage"
COMMIT = ".kvswap/commit"


class RecordingOs(OsAdapter):
    """Records `(step, path)` of every completed step, paths relative to the save path."""

    def __init__(self, save: Path) -> None:
        super().__init__()
        self._save = str(save)
        self._paths: dict[int, str] = {}
        self.steps: list[tuple[str, str]] = []

    def _at(self, dir_fd: int | None, name: str) -> str:
        if dir_fd is None:
            return "" if name == self._save else name
        parent = self._paths[dir_fd]
        return f"{parent}/{name}" if parent else name

    def open(self, name: str, flags: int, *, dir_fd: int, mode: int = 0o600) -> int:
        fd = super().open(name, flags, dir_fd=dir_fd, mode=mode)
        self._paths[fd] = self._at(dir_fd, name)
        return fd

    def open_dir(self, name: str, *, dir_fd: int | None) -> int:
        fd = super().open_dir(name, dir_fd=dir_fd)
        self._paths[fd] = self._at(dir_fd, name)
        return fd

    def close(self, fd: int) -> None:
        path = self._paths.pop(fd)
        super().close(fd)
        self.steps.append(("close", path))

    def write(self, fd: int, parts: object) -> int:
        n = super().write(fd, parts)  # type: ignore[arg-type]
        self.steps.append(("write", self._paths[fd]))
        return n

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.steps.append(("fsync", self._paths[fd]))

    def fsync_dir(self, dir_fd: int) -> None:
        super().fsync_dir(dir_fd)
        self.steps.append(("fsync_dir", self._paths[dir_fd]))

    def replace(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        super().replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        self.steps.append(
            ("replace", f"{self._at(src_dir_fd, src)} -> {self._at(dst_dir_fd, dst)}")
        )

    def unlink(self, name: str, *, dir_fd: int, missing_ok: bool = False) -> bool:
        removed = super().unlink(name, dir_fd=dir_fd, missing_ok=missing_ok)
        self.steps.append(("unlink", self._at(dir_fd, name)))
        return removed

    def rmdir(self, name: str, *, dir_fd: int, missing_ok: bool = False) -> bool:
        removed = super().rmdir(name, dir_fd=dir_fd, missing_ok=missing_ok)
        self.steps.append(("rmdir", self._at(dir_fd, name)))
        return removed


def _index(steps: list[tuple[str, str]], step: str, path: str, *, last: bool = False) -> int:
    found = [i for i, s in enumerate(steps) if s == (step, path)]
    assert found, f"no {step} of {path!r} in:\n" + "\n".join(map(str, steps))
    return found[-1] if last else found[0]


def _publication_steps(save: Path) -> tuple[list[tuple[str, str]], str]:
    """The steps of publishing NEW over OLD, and the stage folder it used."""
    with Publisher(save) as pub:
        pub.publish("m", OLD.files(), FINGERPRINT)
    osio = RecordingOs(save)
    with Publisher(save, osio) as pub:
        osio.steps.clear()  # the sweep at construction is not part of the publication
        pub.publish("m", NEW.files(), FINGERPRINT)
    renames = [t for s, t in osio.steps if s == "replace" and t.startswith(f"{STAGE}/")]
    stage = renames[0].split(" -> ")[0].rsplit("/", 1)[0]
    return osio.steps, stage


def test_every_sync_of_a_publication_comes_in_durability_order(save_dir: Path) -> None:
    steps, stage = _publication_steps(save_dir)
    key = name_key("m")
    commit = _index(steps, "replace", f"{stage}/record.json -> {COMMIT}/{key}.json")
    into_save = [
        i for i, (s, t) in enumerate(steps) if s == "replace" and t.startswith(f"{stage}/")
    ]
    into_save.remove(commit)
    assert sorted(steps[i][1] for i in into_save) == sorted(
        f"{stage}/{role} -> m{suffix}"
        for role, suffix in (("seq", ""), ("dft", ".dft"), ("lora", ".lora"))
    )

    # Every staged file: synced after its last write, before the commit point.
    for role in ("seq", "dft", "lora", "record.json"):
        path = f"{stage}/{role}"
        synced = _index(steps, "fsync", path)
        assert _index(steps, "write", path, last=True) < synced < commit, path
    # The stage's entries and the stage folder's own name, before the commit point.
    record_synced = _index(steps, "fsync", f"{stage}/record.json")
    assert record_synced < _index(steps, "fsync_dir", stage) < commit
    assert record_synced < _index(steps, "fsync_dir", STAGE) < commit
    # The commit record's name, before anything moves into the save path.
    commit_synced = _index(steps, "fsync_dir", COMMIT)
    assert commit < commit_synced < min(into_save)
    # The save path's entries (renames and the retired sidecar), before the stage goes.
    retired = _index(steps, "unlink", "m.ckpt")
    save_synced = _index(steps, "fsync_dir", "", last=True)
    assert max(*into_save, retired) < save_synced < _index(steps, "rmdir", stage)
