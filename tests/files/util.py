"""Helpers shared by the kvswap.files tests and their crash-test child (`crash_child.py`).

Absolute imports only: the child runs this folder as a script directory, the tests import it
as `files.util`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from kvswap.files import Generation, seqfile, sidecar
from kvswap.files.stage import FileContent
from kvswap.files.types import SIDECAR_SUFFIXES, Suffix

FINGERPRINT = "test-model:f16:f16"


def make_state(tag: str, n_payload: int) -> bytes:
    """A RAM state (`get_data` layout): prefix, then a payload that starts with `tag`."""
    head = tag.encode().ljust(32, b"\0")
    body = hashlib.shake_256(tag.encode()).digest(max(n_payload - len(head), 0))
    return struct.pack("<II", seqfile.STATE_MAGIC, 0) + head + body


def tokens_for(tag: str, n_tokens: int = 7) -> list[int]:
    seed = int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "little")
    return [(seed + 31 * i) % 50_000 for i in range(n_tokens)]


@dataclass(frozen=True)
class GenSpec:
    """What a test generation holds: F for `tag`, plus sidecars `suffixes` tagged the same."""

    tag: str
    suffixes: tuple[Suffix, ...] = ()
    n_payload: int = 300

    def files(self) -> dict[str, FileContent]:
        state = make_state(self.tag, self.n_payload)
        out: dict[str, FileContent] = {"": seqfile.file_parts(tokens_for(self.tag), state)}
        for suffix in self.suffixes:
            sections = [self.tag.encode() * 3, suffix.encode() * 5]
            out[suffix] = sidecar.encode(suffix, {"tag": self.tag}, sections)
        return out


def assert_generation(gen: Generation, spec: GenSpec) -> None:
    """The read generation is exactly `spec`: F and every sidecar, nothing else."""
    assert not gen.foreign
    assert gen.tokens.tolist() == tokens_for(spec.tag), (gen.tokens[:4], spec.tag)
    assert bytes(gen.state) == make_state(spec.tag, spec.n_payload)
    for suffix in SIDECAR_SUFFIXES:
        read = gen.sidecars[suffix]
        if suffix in spec.suffixes:
            assert read.status == "ok", (suffix, read)
            assert read.sidecar is not None
            assert read.sidecar.header == {"tag": spec.tag}
            assert bytes(read.sidecar.sections[0]) == spec.tag.encode() * 3
        else:
            assert read.status == "absent", (suffix, read)


def tag_of(gen: Generation) -> str:
    """The tag F's payload starts with (for tests that do not know which generation won)."""
    return bytes(gen.payload[:32]).rstrip(b"\0").decode()


def tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under `root` (not following symlinks): kind and content digest."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in [*dirnames, *filenames]:
            path = Path(dirpath, entry)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", hashlib.sha256(path.read_bytes()).digest())
            else:
                out[rel] = ("dir", b"")
    return out


def stage_entries(save_dir: Path) -> list[str]:
    return sorted(os.listdir(save_dir / ".kvswap" / "stage"))


OLD_SPEC = GenSpec("old", (".ckpt", ".dft"))
NEW_SPEC = GenSpec("new", (".dft", ".lora"))
BIG_TAG = "big"


def writer_spec(writer: int, i: int) -> GenSpec:
    """Generation i of concurrent writer `writer`; writers differ in their sidecar sets."""
    suffixes: tuple[Suffix, ...] = (".dft",) if writer % 2 else (".ckpt", ".lora")
    return GenSpec(f"w{writer}-{i}", suffixes, n_payload=4096 + 64 * i)


def spec_for_tag(tag: str) -> GenSpec:
    """Rebuild the spec of a tag written by `writer_spec` (or OLD_SPEC/NEW_SPEC)."""
    if tag == OLD_SPEC.tag:
        return OLD_SPEC
    if tag == NEW_SPEC.tag:
        return NEW_SPEC
    writer, i = tag[1:].split("-")
    return writer_spec(int(writer), int(i))
