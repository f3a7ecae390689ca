"""Publisher: round trips, foreign files, corrupt files, symlinks, typed errors."""

from __future__ import annotations

import errno
import mmap
import os
import platform
import struct
import threading
import time
from pathlib import Path

import pytest

from kvswap.files import (
    CorruptFileError,
    FilesIOError,
    InvalidNameError,
    NotFoundError,
    OsAdapter,
    Publisher,
    SavePathError,
    UnsafePathError,
    WrongModelError,
    seqfile,
)
from kvswap.files.faults import FailAt
from kvswap.files.osio import Phase, StepName

from .util import FINGERPRINT, GenSpec, assert_generation, make_state, stage_entries, tag_of, tree

pytestmark = pytest.mark.timeout(30)


def _publish(pub: Publisher, name: str, spec: GenSpec) -> None:
    pub.publish(name, spec.files(), FINGERPRINT)


def test_round_trip_and_receipt(save_dir: Path) -> None:
    spec = GenSpec("g1", (".ckpt", ".dft", ".lora"))
    with Publisher(save_dir) as pub:
        receipt = pub.publish("mind", spec.files(), FINGERPRINT)
        assert receipt.n_files == 4 and receipt.name == "mind"
        assert receipt.n_bytes == sum(e.n_bytes for e in receipt.files)
        assert sorted(os.listdir(save_dir)) == [
            ".kvswap",
            "mind",
            "mind.ckpt",
            "mind.dft",
            "mind.lora",
        ]
        with pub.read_generation("mind", FINGERPRINT) as gen:
            assert_generation(gen, spec)
            assert gen.packed and gen.record is not None
            assert gen.record.generation == receipt.generation
        assert stage_entries(save_dir) == []


def test_new_generation_retires_missing_sidecars(save_dir: Path) -> None:
    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("old", (".ckpt", ".dft")))
        new = GenSpec("new", (".lora",))
        _publish(pub, "m", new)
        assert sorted(os.listdir(save_dir)) == [".kvswap", "m", "m.lora"]
        with pub.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, new)


def test_caller_allocator(save_dir: Path) -> None:
    spec = GenSpec("alloc", (".dft",))
    got: list[int] = []

    def alloc(n: int) -> memoryview:
        got.append(n)
        return memoryview(bytearray(n + 16))

    with Publisher(save_dir) as pub:
        _publish(pub, "m", spec)
        gen = pub.read_generation("m", FINGERPRINT, alloc=alloc)
        assert_generation(gen, spec)
        assert got[0] == len(make_state("alloc", spec.n_payload))
        gen.close()


def test_close_refuses_while_a_view_is_held(save_dir: Path) -> None:
    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("v"))
        gen = pub.read_generation("m", FINGERPRINT)
        held = gen.payload  # a caller's view
        with pytest.raises(BufferError):
            gen.close()
        held.release()
        gen.close()


def _foreign_plain(tokens: list[int], payload: bytes) -> bytes:
    return struct.pack(f"<III{len(tokens)}i", seqfile.GGSQ_MAGIC, 3, len(tokens), *tokens) + payload


def test_foreign_files_plain_and_packed(save_dir: Path) -> None:
    payload = make_state("foreign", 100)[8:]
    (save_dir / "plain.bin").write_bytes(_foreign_plain([5, 6, 7], payload))
    state = make_state("foreign", 100)
    (save_dir / "packed.bin").write_bytes(
        b"".join(bytes(p) for p in seqfile.file_parts([5, 6, 7], state))
    )
    (save_dir / "packed.bin.dft").write_bytes(b"a stale sidecar nobody vouches for")
    with Publisher(save_dir) as pub:
        for name, packed in (("plain.bin", False), ("packed.bin", True)):
            with pub.read_generation(name, "any model") as gen:
                assert gen.foreign and gen.record is None and gen.packed == packed
                assert gen.tokens.tolist() == [5, 6, 7]
                assert bytes(gen.payload) == payload
                assert bytes(gen.state) == state
                assert {r.status for r in gen.sidecars.values()} == {"absent"}
        (save_dir / "torn.bin").write_bytes(_foreign_plain([5, 6, 7], payload)[:20])
        with pytest.raises(CorruptFileError):
            pub.read_generation("torn.bin", "x")


def test_not_found_and_wrong_model(save_dir: Path) -> None:
    with Publisher(save_dir) as pub:
        with pytest.raises(NotFoundError) as info:
            pub.read_generation("nothing", FINGERPRINT)
        assert info.value.http_status == 404
        _publish(pub, "m", GenSpec("g"))
        with pytest.raises(WrongModelError) as info2:
            pub.read_generation("m", "another model")
        assert info2.value.http_status == 400
        (save_dir / "m").unlink()  # record left, F gone
        with pytest.raises(NotFoundError):
            pub.read_generation("m", FINGERPRINT)


@pytest.mark.parametrize(
    "damage", ["truncate_payload", "truncate_header", "flip_payload", "flip_token", "extend"]
)
def test_damaged_f_is_refused(save_dir: Path, damage: str) -> None:
    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("g", (".dft",)))
        path = save_dir / "m"
        data = bytearray(path.read_bytes())
        if damage == "truncate_payload":
            data = data[:-1]
        elif damage == "truncate_header":
            data = data[:10]
        elif damage == "flip_payload":
            data[-3] ^= 0x10
        elif damage == "flip_token":
            data[seqfile.FIXED_HEADER_BYTES + 12] ^= 0x01
        else:
            data += b"\0"
        path.write_bytes(data)
        with pytest.raises(CorruptFileError) as info:
            pub.read_generation("m", FINGERPRINT)
        assert info.value.kind == "corrupt"


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "extend", "garbage"])
def test_damaged_sidecar_restores_cold(save_dir: Path, damage: str) -> None:
    spec = GenSpec("g", (".ckpt", ".dft"))
    with Publisher(save_dir) as pub:
        _publish(pub, "m", spec)
        path = save_dir / "m.dft"
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif damage == "flip":
            data[len(data) // 2] ^= 0x04
            path.write_bytes(data)
        elif damage == "delete":
            path.unlink()
        elif damage == "extend":
            path.write_bytes(data + b"x")
        else:
            path.write_bytes(os.urandom(len(data)))
        with pub.read_generation("m", FINGERPRINT) as gen:
            assert tag_of(gen) == "g"
            read = gen.sidecars[".dft"]
            assert read.status == ("missing" if damage == "delete" else "corrupt")
            assert read.reason and read.sidecar is None
            assert gen.sidecars[".ckpt"].status == "ok"


def test_remove_and_list(save_dir: Path) -> None:
    with Publisher(save_dir) as pub:
        _publish(pub, "a", GenSpec("a", (".dft",)))
        _publish(pub, "b", GenSpec("b"))
        (save_dir / "foreign").write_bytes(_foreign_plain([1], b"\0" * 8))
        infos = pub.list_generations()
        assert [i.name for i in infos] == ["a", "b"]
        assert [e.suffix for e in infos[0].files] == ["", ".dft"]
        assert not infos[0].pending and infos[0].fingerprint == FINGERPRINT
        assert pub.remove("a")
        assert not pub.remove("a")
        assert sorted(os.listdir(save_dir)) == [".kvswap", "b", "foreign"]
        assert [i.name for i in pub.list_generations()] == ["b"]
        with pytest.raises(NotFoundError):
            pub.read_generation("a", FINGERPRINT)
        assert pub.remove("foreign")
        assert not (save_dir / "foreign").exists()


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "a/b", "a\0b", "..", ".kvswap", "m.ckpt", "a\\b"]
)
def test_path_escapes_are_invalid_names(save_dir: Path, outside: Path, name: str) -> None:
    before = tree(save_dir.parent)
    with Publisher(save_dir) as pub:
        snapshot = tree(save_dir.parent)
        with pytest.raises(InvalidNameError):
            pub.publish(name, GenSpec("x").files(), FINGERPRINT)
        with pytest.raises(InvalidNameError):
            pub.read_generation(name, FINGERPRINT)
        with pytest.raises(InvalidNameError):
            pub.remove(name)
        assert tree(save_dir.parent) == snapshot
    assert {k: v for k, v in before.items() if not k.startswith("save")} == {
        k: v for k, v in tree(save_dir.parent).items() if not k.startswith("save")
    }


@pytest.mark.parametrize("suffix", ["", ".dft", ".ckpt"])
def test_planted_symlink_is_never_followed(save_dir: Path, outside: Path, suffix: str) -> None:
    secret = outside / "secret"
    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("old", (".dft",)))
        planted = save_dir / f"m{suffix}"
        planted.unlink(missing_ok=True)
        os.symlink(secret, planted)
        before = tree(outside)
        with pytest.raises(UnsafePathError):
            pub.publish("m", GenSpec("new", (".dft",)).files(), FINGERPRINT)
        if suffix != ".ckpt":  # the .ckpt link is not part of the committed generation
            with pytest.raises(UnsafePathError):
                pub.read_generation("m", FINGERPRINT)
        with pytest.raises(UnsafePathError):
            pub.remove("m")
        assert tree(outside) == before
        assert os.path.islink(save_dir / f"m{suffix}")
        assert stage_entries(save_dir) == []


def test_symlinked_foreign_file_and_special_files(save_dir: Path, outside: Path) -> None:
    os.symlink(outside / "secret", save_dir / "link")
    os.mkfifo(save_dir / "fifo")
    (save_dir / "dir").mkdir()
    with Publisher(save_dir) as pub:
        for name in ("link", "fifo", "dir"):
            with pytest.raises(UnsafePathError):
                pub.read_generation(name, FINGERPRINT)


@pytest.mark.parametrize("which", [".kvswap", ".kvswap/stage", ".kvswap/commit", ".kvswap/lock"])
def test_symlinked_metadata_folder_is_refused(save_dir: Path, outside: Path, which: str) -> None:
    if which != ".kvswap":
        (save_dir / ".kvswap").mkdir()
    target = outside / "meta"
    target.mkdir()
    os.symlink(target, save_dir / which)
    before = tree(outside)
    with pytest.raises(SavePathError) as info:
        Publisher(save_dir)
    assert info.value.http_status == 500
    assert tree(outside) == before


def test_missing_save_path(tmp_path: Path) -> None:
    with pytest.raises(SavePathError):
        Publisher(tmp_path / "nope")


def test_stat_error_is_reported_never_absent(
    save_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    osio = OsAdapter()
    with Publisher(save_dir, osio) as pub:
        _publish(pub, "m", GenSpec("old"))
        # every stat step of a publication and of a read, one at a time, says EACCES
        for op in ("publish", "read"):
            for k in range(20):
                hook = FailAt(k, errno=errno.EACCES, only="stat")
                osio.hook = hook
                try:
                    if op == "publish":
                        _publish(pub, "m", GenSpec("new"))
                    else:
                        pub.read_generation("m", FINGERPRINT).close()
                except FilesIOError as e:
                    assert hook.fired and e.errno == errno.EACCES
                else:
                    assert not hook.fired
                finally:
                    osio.hook = None
    # the adapter itself: only ENOENT is "absent"
    real_stat = os.stat

    def denied(*args: object, **kwargs: object) -> os.stat_result:
        raise PermissionError(errno.EACCES, "denied")

    fd = os.open(save_dir, os.O_RDONLY)
    try:
        assert osio.lstat("no-such-file", dir_fd=fd) is None
        monkeypatch.setattr(os, "stat", denied)
        with pytest.raises(PermissionError):
            osio.lstat("m", dir_fd=fd)
        monkeypatch.setattr(os, "stat", real_stat)
        with pytest.raises(OSError) as info:
            osio.lstat("x" * 300, dir_fd=fd)
        assert info.value.errno == errno.ENAMETOOLONG
    finally:
        os.close(fd)


def test_failed_directory_sync_is_an_error(save_dir: Path) -> None:
    osio = OsAdapter()
    with Publisher(save_dir, osio) as pub:
        _publish(pub, "m", GenSpec("old"))
        current, n_failed = "old", 0
        for k in range(10):
            osio.hook = hook = FailAt(k, only="fsync_dir")
            try:
                _publish(pub, "m", GenSpec(f"new{k}"))
            except FilesIOError as e:
                assert e.errno == errno.EIO
                n_failed += 1
            finally:
                osio.hook = None
            if not hook.fired:
                break
            with pub.read_generation("m", FINGERPRINT) as gen:
                assert tag_of(gen) in (current, f"new{k}")  # whole old or whole new
                current = tag_of(gen)
        assert n_failed >= 4  # stage folder, stage parent, commit folder, save path
        assert stage_entries(save_dir) == []


def test_threads_publish_and_read_one_name(save_dir: Path) -> None:
    errors: list[BaseException] = []
    specs = {
        f"t{t}-{i}": GenSpec(f"t{t}-{i}", ((".dft",) if t % 2 else (".ckpt", ".lora")))
        for t in range(3)
        for i in range(8)
    }

    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("t0-0", (".ckpt", ".lora")))

        def writer(t: int) -> None:
            try:
                for i in range(8):
                    _publish(pub, "m", specs[f"t{t}-{i}"])
            except BaseException as e:  # reported below
                errors.append(e)

        def reader() -> None:
            try:
                for _ in range(40):
                    with pub.read_generation("m", FINGERPRINT) as gen:
                        assert_generation(gen, specs[tag_of(gen)])
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors
    assert stage_entries(save_dir) == []


def test_publish_refuses_a_bad_f(save_dir: Path) -> None:
    with Publisher(save_dir) as pub:
        with pytest.raises(ValueError):
            pub.publish("m", {"": [b"not a sequence file"]}, FINGERPRINT)
        with pytest.raises(ValueError):
            pub.publish("m", {".dft": [b""]}, FINGERPRINT)
        with pytest.raises(ValueError):
            pub.publish("m", {"": GenSpec("x").files()[""], ".bak": [b""]}, FINGERPRINT)
    assert sorted(os.listdir(save_dir)) == [".kvswap"]
    _ = mmap  # anonymous maps are the default buffers (see reader)


def test_crc_on_a_helper_thread(save_dir: Path) -> None:
    spec = GenSpec("overlap", (".ckpt",), n_payload=(20 << 20) + 5)  # several 8 MiB chunks
    with Publisher(save_dir, overlap_crc=True) as pub:
        receipt = pub.publish("m", spec.files(), FINGERPRINT)
        with pub.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, spec)
    with Publisher(save_dir) as inline, inline.read_generation("m", FINGERPRINT) as gen:
        assert gen.record is not None and gen.record.files == receipt.files  # same CRCs inline


def test_stream_crc_matches_zlib() -> None:
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    from kvswap.files import checksum

    data = os.urandom(3 << 20)
    with ThreadPoolExecutor(1) as pool:
        for executor in (None, pool):
            crc = checksum.StreamCrc(executor)
            for off in range(0, len(data), 1 << 20):
                crc.feed(memoryview(data)[off : off + (1 << 20)])
            assert crc.value() == zlib.crc32(data)


def test_size_limit_before_allocation(save_dir: Path) -> None:
    from kvswap.files import TooLargeError

    spec = GenSpec("big", (".dft",), n_payload=10_000)
    with Publisher(save_dir) as pub:
        receipt = pub.publish("m", spec.files(), FINGERPRINT)
        with pytest.raises(TooLargeError):
            pub.read_generation("m", FINGERPRINT, max_bytes=receipt.n_bytes - 1)
        pub.read_generation("m", FINGERPRINT, max_bytes=receipt.n_bytes).close()


def test_publish_refuses_raw_bytes_as_a_sidecar(save_dir: Path) -> None:
    with Publisher(save_dir) as pub, pytest.raises(ValueError, match="sidecar"):
        pub.publish("m", {"": GenSpec("x").files()[""], ".dft": [b"raw draft bytes"]}, FINGERPRINT)


# flock(2)'s number, to see a thread blocked in it (/proc/self/task/TID/syscall).
FLOCK_SYSCALL = {"x86_64": 73, "aarch64": 32}[platform.machine()]


def _blocked_in_flock(tid: int) -> bool:
    try:
        text = Path(f"/proc/self/task/{tid}/syscall").read_text().split()
    except FileNotFoundError:
        return False  # the thread has ended
    return bool(text) and text[0] == str(FLOCK_SYSCALL)


def test_a_reader_holds_commits_off(save_dir: Path) -> None:
    """A publisher (another instance: only flock excludes it) cannot commit mid-read: the reader
    holds its read until the kernel shows the publisher blocked in flock on the name lock, and
    the commit comes only after the read ended."""
    events: list[str] = []
    reading = threading.Event()
    writer_tid: list[int] = []

    def reader_hook(phase: Phase, step: StepName, target: str) -> None:
        if step == "read" and phase == "before" and not reading.is_set():
            reading.set()
            deadline = time.monotonic() + 30
            while not (writer_tid and _blocked_in_flock(writer_tid[0])):
                assert "commit" not in events, "the publisher committed while a read held the lock"
                assert time.monotonic() < deadline, "the publisher never blocked on the lock"
                time.sleep(0.001)
            events.append("writer blocked")
        if step == "read" and phase == "after":
            events.append("read")

    def writer_hook(phase: Phase, step: StepName, target: str) -> None:
        if step == "replace" and phase == "after" and target.startswith("record.json"):
            events.append("commit")

    def publish_new(writer: Publisher) -> None:
        reading.wait()
        writer_tid.append(threading.get_native_id())
        _publish(writer, "m", GenSpec("new"))

    with Publisher(save_dir) as pub:
        _publish(pub, "m", GenSpec("old"))
    with (
        Publisher(save_dir, OsAdapter(reader_hook)) as reader,
        Publisher(save_dir, OsAdapter(writer_hook)) as writer,
    ):
        thread = threading.Thread(target=publish_new, args=(writer,))
        thread.start()
        with reader.read_generation("m", FINGERPRINT) as gen:
            assert tag_of(gen) == "old"
        thread.join()
        assert events[0] == "writer blocked" and events[-1] == "commit", events
        assert events.count("commit") == 1 and "read" in events, events
        with reader.read_generation("m", FINGERPRINT) as gen:
            assert tag_of(gen) == "new"


def test_every_truncation_and_byte_flip_of_f_is_refused(save_dir: Path) -> None:
    spec = GenSpec("small", (".dft",), n_payload=40)
    with Publisher(save_dir) as pub:
        _publish(pub, "m", spec)
        path = save_dir / "m"
        good = path.read_bytes()
        for cut in range(len(good)):
            path.write_bytes(good[:cut])
            with pytest.raises(CorruptFileError):
                pub.read_generation("m", FINGERPRINT)
        for i in range(len(good)):
            path.write_bytes(good[:i] + bytes([good[i] ^ (1 << (i % 8))]) + good[i + 1 :])
            with pytest.raises(CorruptFileError):
                pub.read_generation("m", FINGERPRINT)
        path.write_bytes(good)
        with pub.read_generation("m", FINGERPRINT) as gen:
            assert_generation(gen, spec)
