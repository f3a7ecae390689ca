"""Small shared vocabulary of `kvswap.files`: buffer type, file suffixes, on-disk constants.

Owns no state and does no I/O. Any module of the package (and its callers) may import it.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

# What the writers accept and the readers hand out. Wrap an mmap or a numpy array in a
# `memoryview` to pass it: every consumer here takes the buffer protocol, never copies it.
Buffer: TypeAlias = bytes | bytearray | memoryview

# The files of a generation, by suffix: "" is F itself (libllama's sequence file).
Suffix = Literal["", ".ckpt", ".dft", ".lora"]
SIDECAR_SUFFIXES: Final[tuple[Suffix, ...]] = (".ckpt", ".dft", ".lora")
ALL_SUFFIXES: Final[tuple[Suffix, ...]] = ("", *SIDECAR_SUFFIXES)

# kvswap's metadata folder inside the save path; a slot file can never take this name.
META_DIR_NAME: Final = ".kvswap"
