"""The one adapter through which every OS step of `kvswap.files` goes.

Owns: the list of OS steps (open, close, read, write, fsync, fsync_dir, replace, stat, unlink,
mkdir, rmdir, listdir, flock), the platform differences between them, and the fault seam: a hook
called before and after each step, which tests use to count the steps of a publication and to
raise an `OSError` or kill the process at any one of them (see `kvswap.files.faults`).

Callers: the other modules of this package, never the engine thread. Every path argument is a
single name (no separator) resolved against an open directory fd (`dir_fd`), and every open uses
`O_NOFOLLOW`, so a symlink planted in the save path is never followed.

Does not: interpret errors (callers map `OSError` to `FilesError`), except that `lstat` answers
`None` for "absent" only on `ENOENT`: any other error (permission, I/O) is raised, never taken
for "absent". A failed directory sync is raised like any other error.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, TypeVar

from kvswap.files.types import Buffer

Phase = Literal["before", "after"]
StepName = Literal[
    "open",
    "close",
    "read",
    "write",
    "fsync",
    "fsync_dir",
    "replace",
    "stat",
    "unlink",
    "mkdir",
    "rmdir",
    "listdir",
    "flock",
    "allocate",
    "truncate",
]

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# Linux caps one writev at IOV_MAX buffers (1024); stay well under it.
_MAX_IOV = 512

_T = TypeVar("_T")


class FaultHook(Protocol):
    """Called before and after every OS step; may raise `OSError` or end the process."""

    def __call__(self, phase: Phase, step: StepName, target: str) -> None: ...


class OsAdapter:
    """Every OS call `kvswap.files` makes. Stateless apart from the hook; thread-safe."""

    def __init__(self, hook: FaultHook | None = None) -> None:
        self.hook = hook

    def _step(self, step: StepName, target: str, fn: Callable[[], _T]) -> _T:
        hook = self.hook
        if hook is not None:
            hook("before", step, target)
        result = fn()
        if hook is not None:
            hook("after", step, target)
        return result

    # -- files -----------------------------------------------------------------------------

    def open(self, name: str, flags: int, *, dir_fd: int, mode: int = 0o600) -> int:
        """Open `name` relative to `dir_fd`, never following a symlink (ELOOP instead)."""
        full = flags | O_NOFOLLOW | O_CLOEXEC
        return self._open_step(name, lambda: os.open(name, full, mode, dir_fd=dir_fd))

    def open_dir(self, name: str, *, dir_fd: int | None) -> int:
        """Open a directory (relative to `dir_fd`, or absolute when it is None) for *at calls.

        A symlink as the last component fails with ELOOP (or ENOTDIR), never followed.
        """
        flags = os.O_RDONLY | O_DIRECTORY | O_CLOEXEC
        if dir_fd is not None:
            flags |= O_NOFOLLOW
        return self._open_step(name, lambda: os.open(name, flags, dir_fd=dir_fd))

    def _open_step(self, name: str, fn: Callable[[], int]) -> int:
        """An open whose after-hook fails must not leak the descriptor it opened."""
        if self.hook is not None:
            self.hook("before", "open", name)
        fd = fn()
        if self.hook is not None:
            try:
                self.hook("after", "open", name)
            except BaseException:
                os.close(fd)
                raise
        return fd

    def close(self, fd: int) -> None:
        """Close `fd`. Like close(2) on Linux, the descriptor is gone even when an error is
        reported (so an injected failure cannot leak a descriptor or a `flock` held on it)."""
        try:
            if self.hook is not None:
                self.hook("before", "close", str(fd))
        except BaseException:
            os.close(fd)
            raise
        self._step_after("close", str(fd), lambda: os.close(fd))

    def _step_after(self, step: StepName, target: str, fn: Callable[[], None]) -> None:
        fn()
        if self.hook is not None:
            self.hook("after", step, target)

    def write(self, fd: int, parts: Sequence[Buffer]) -> int:
        """One write system call of up to `_MAX_IOV` buffers; returns the bytes written."""
        if not hasattr(os, "writev"):  # pragma: no cover - not POSIX
            return self._step("write", str(fd), lambda: os.write(fd, parts[0]))
        batch = list(parts[:_MAX_IOV])
        return self._step("write", str(fd), lambda: os.writev(fd, batch))

    def readinto(self, fd: int, view: memoryview) -> int:
        """One read system call into `view`; returns the bytes read (0 at end of file)."""
        return self._step("read", str(fd), lambda: os.readv(fd, [view]))

    def read_up_to(self, fd: int, n_bytes: int) -> bytes:
        """Read until `n_bytes` are in or the file ends (fewer then)."""
        buf = bytearray(n_bytes)
        view = memoryview(buf)
        got = 0
        while got < n_bytes:
            n = self.readinto(fd, view[got:])
            if n == 0:
                break
            got += n
        view.release()
        return bytes(buf[:got])

    def allocate(self, fd: int, n_bytes: int) -> None:
        """Give a new file `n_bytes` of disk blocks now (`posix_fallocate`), so that writing
        it through a mapping cannot meet a full disk (which would end the process, SIGBUS):
        a full disk or a file-size limit fails here, with its errno."""
        self._step("allocate", str(fd), lambda: os.posix_fallocate(fd, 0, n_bytes))

    def truncate(self, fd: int, n_bytes: int) -> None:
        """Cut a file to `n_bytes`."""
        self._step("truncate", str(fd), lambda: os.ftruncate(fd, n_bytes))

    def fsync(self, fd: int) -> None:
        """Make a file's data durable (F_FULLFSYNC where plain fsync does not reach the disk)."""
        if sys.platform == "darwin":  # pragma: no cover - platform difference lives here
            self._step("fsync", str(fd), lambda: fcntl.fcntl(fd, fcntl.F_FULLFSYNC))  # type: ignore[attr-defined]
            return
        self._step("fsync", str(fd), lambda: os.fsync(fd))

    def fsync_dir(self, dir_fd: int) -> None:
        """Make a directory's entries durable; a failure is an error like any other."""
        self._step("fsync_dir", str(dir_fd), lambda: os.fsync(dir_fd))

    def fstat(self, fd: int) -> os.stat_result:
        return self._step("stat", str(fd), lambda: os.fstat(fd))

    def flock(self, fd: int, *, exclusive: bool, blocking: bool = True) -> bool:
        """`flock(2)` an open lock file shared or exclusive; released when `fd` is closed.

        Non-blocking, answers False when another open file description holds it.
        """
        op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)

        def call() -> bool:
            try:
                fcntl.flock(fd, op)
            except OSError as e:
                # EWOULDBLOCK on Linux; EACCES/EAGAIN where flock is emulated with fcntl locks
                if not blocking and e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return False
                raise
            return True

        return self._step("flock", str(fd), call)

    # -- directory entries -----------------------------------------------------------------

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result | None:
        """`lstat` of `name`; None only when it does not exist (ENOENT). Other errors raise."""

        def call() -> os.stat_result | None:
            try:
                return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return None

        return self._step("stat", name, call)

    def replace(self, src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int) -> None:
        """Atomically rename `src` over `dst` (a symlink at `dst` is replaced, not followed)."""
        self._step(
            "replace",
            f"{src}->{dst}",
            lambda: os.replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd),
        )

    def unlink(self, name: str, *, dir_fd: int, missing_ok: bool = False) -> bool:
        """Remove a file (or a symlink itself); returns False when it was already absent."""

        def call() -> bool:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return False
            return True

        return self._step("unlink", name, call)

    def mkdir(self, name: str, *, dir_fd: int, exist_ok: bool = False) -> bool:
        """Create a directory (mode 0700); returns False when it already existed."""

        def call() -> bool:
            try:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
            except FileExistsError:
                if not exist_ok:
                    raise
                return False
            return True

        return self._step("mkdir", name, call)

    def rmdir(self, name: str, *, dir_fd: int, missing_ok: bool = False) -> bool:
        def call() -> bool:
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return False
            return True

        return self._step("rmdir", name, call)

    def listdir(self, dir_fd: int) -> list[str]:
        return self._step("listdir", str(dir_fd), lambda: os.listdir(dir_fd))


def is_missing(err: OSError) -> bool:
    """True for the one error that means "absent"."""
    return err.errno == errno.ENOENT


def is_symlink_refusal(err: OSError) -> bool:
    """True when an O_NOFOLLOW open met a symlink (ELOOP; some systems say EMLINK/ENOTDIR)."""
    return err.errno in (errno.ELOOP, errno.EMLINK)
