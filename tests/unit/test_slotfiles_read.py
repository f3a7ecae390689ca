"""A mind's disk copy read back into the page store's recycled buffers (`tiers.slotfiles`), on
real files: the read is the copy from the page cache and its checksum, no fresh memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvswap.engine.kv.buffers import new_buffer
from kvswap.engine.kv.pagestore import SHELF_KEY, PageStore
from kvswap.files import CorruptFileError, Publisher
from kvswap.tiers.slotfiles import publish_state, read_state
from tests.unit.standins import GEOMETRY, fill, layout_of, tokens

MiB = 1 << 20


def _published(save: Path, n_tokens: int) -> Publisher:
    publisher = Publisher(save)
    layout = layout_of(n_tokens)
    buffer = new_buffer(layout.n_bytes)
    fill(buffer, layout, tokens(n_tokens))
    publish_state(publisher, "mind", buffer, layout)
    buffer.close()
    return publisher


def _shelved(store: PageStore) -> int:
    return dict(store.reservations()).get(SHELF_KEY, 0)


def test_a_read_back_lands_in_a_shelved_buffer_and_gives_it_back(tmp_path: Path) -> None:
    """Defect caught: a disk switch faulting a fresh buffer in for every read (the kernel
    zeroing each page: most of a read from the page cache). The read takes the store's shelved
    buffer, uncharged while it holds it (a read's buffers never counted against the store),
    and closing the state puts it back on the shelf, charged again; the tokens are the file's."""
    publisher = _published(tmp_path, 200_000)  # 2.4 MB: worth a place on the shelf
    store = PageStore(64 * MiB, shelf_max=2)
    shelved = new_buffer(3 * MiB)
    store.shelve(shelved, None)
    read = read_state(publisher, "mind", GEOMETRY, store)
    assert read.buffers is not None and read.buffers.taken == [shelved]
    assert store.charged_bytes == 0
    assert np.array_equal(read.state.tokens, np.array(tokens(200_000), dtype=np.int32))
    read.close()
    assert _shelved(store) == store.charged_bytes == 3 * MiB
    store.check_integrity()


def test_a_read_that_fails_gives_its_buffer_back(tmp_path: Path) -> None:
    """Defect caught: a damaged file leaking the buffer it was being read into. The typed
    error is raised and the buffer is back on the shelf, nothing else charged or leaked."""
    publisher = _published(tmp_path, 200_000)
    data = bytearray((tmp_path / "mind").read_bytes())
    data[-100] ^= 0xFF
    (tmp_path / "mind").write_bytes(bytes(data))
    store = PageStore(64 * MiB, shelf_max=2)
    store.shelve(new_buffer(3 * MiB), None)
    with pytest.raises(CorruptFileError):
        read_state(publisher, "mind", GEOMETRY, store)
    assert _shelved(store) == store.charged_bytes == 3 * MiB
    store.check_integrity()
    store.close()


def test_a_mapped_read_back_is_the_files_state_and_leaves_the_file_alone(tmp_path: Path) -> None:
    """Decision: a mind's own file is mapped, its pages read in, and the state set_data takes
    is a view of the mapping (no buffer faulted in, no second copy): the same bytes a plain
    read gives, nothing taken off the shelf, the file unchanged by the prefix written before
    the payload (a private mapping), and the mapping gone once the state is closed."""
    publisher = _published(tmp_path, 200_000)
    before = (tmp_path / "mind").read_bytes()
    store = PageStore(64 * MiB, shelf_max=2)
    store.shelve(new_buffer(3 * MiB), None)
    mapped = read_state(publisher, "mind", GEOMETRY, store, mapped=True)
    read = read_state(Publisher(tmp_path), "mind", GEOMETRY)
    assert bytes(mapped.state.target) == bytes(read.state.target)
    assert np.array_equal(mapped.state.tokens, read.state.tokens)
    assert mapped.buffers is not None and mapped.buffers.taken == []  # the shelf is untouched
    maps = list(mapped.generation._maps)
    assert len(maps) == 1 and len(maps[0]) == len(before)  # the file itself, mapped
    mapped.close()
    read.close()
    assert all(m.closed for m in maps)
    assert (tmp_path / "mind").read_bytes() == before
    assert _shelved(store) == 3 * MiB
    store.close()


def test_a_damaged_file_mapped_is_refused_and_unmapped(tmp_path: Path) -> None:
    """Defect caught: a mapped read trusting the file: a flipped byte fails its checksum, the
    typed error is raised, and nothing is charged."""
    publisher = _published(tmp_path, 200_000)
    data = bytearray((tmp_path / "mind").read_bytes())
    data[-100] ^= 0xFF
    (tmp_path / "mind").write_bytes(bytes(data))
    store = PageStore(64 * MiB, shelf_max=2)
    with pytest.raises(CorruptFileError, match="checksum"):
        read_state(publisher, "mind", GEOMETRY, store, mapped=True)
    assert store.charged_bytes == 0
    store.check_integrity()
    store.close()
