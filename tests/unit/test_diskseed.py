"""Which of its tenant's minds on disk a new mind starts from (`minds.diskseed`): pure choice
over the registry, the page store and the minds' token headers (no files, no libllama)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey, mind_key
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.registry import DiskCopy, MindRegistry
from kvswap.files import FilesError
from kvswap.minds.diskseed import MAX_DONOR_RATIO, MIN_PREFIX, DiskSeeds
from tests.unit.standins import put_page

OPENING = np.arange(1000, 1000 + 2 * MIN_PREFIX, dtype=np.int32)


def _seeds(heads: dict[PageKey, npt.NDArray[np.int32]]) -> tuple[DiskSeeds, MindRegistry]:
    registry = MindRegistry()
    for i, (key, tokens) in enumerate(heads.items()):
        registry.record_disk(key, DiskCopy(len(tokens) * 100, len(tokens), 0.0))
        registry.touch(key, when_unix_s=float(i))

    def head(key: PageKey) -> npt.NDArray[np.int32]:
        if key not in heads:
            raise FilesError("no file")
        return heads[key]

    return DiskSeeds(registry, PageStore(64 << 20), head), registry


def _prompt(*parts: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    return np.concatenate([*parts, np.array([7, 8, 9], dtype=np.int32)])


def test_the_longest_shared_prefix_of_the_tenants_minds_on_disk_is_chosen() -> None:
    short, long = mind_key("a", "short"), mind_key("a", "long")
    seeds, _ = _seeds({
        short: np.concatenate([OPENING[:MIN_PREFIX], [5] * 50]).astype(np.int32),
        long: np.concatenate([OPENING, [6] * 50]).astype(np.int32),
    })  # fmt: skip
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) == (long, len(OPENING))


def test_another_tenants_minds_are_never_read() -> None:
    theirs = mind_key("b", "theirs")
    seeds, _ = _seeds({theirs: OPENING})
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) is None


def test_a_prefix_that_does_not_pay_the_read_is_left() -> None:
    """Under `MIN_PREFIX` tokens, or a donor holding more than `MAX_DONOR_RATIO` times its
    prefix (its whole state would be read for a small part): the mind starts from its prompt."""
    small = mind_key("a", "small")
    seeds, _ = _seeds({small: OPENING[: MIN_PREFIX - 1]})
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) is None
    huge = mind_key("a", "huge")
    tail = np.full(MAX_DONOR_RATIO * len(OPENING), 3, dtype=np.int32)
    seeds, _ = _seeds({huge: np.concatenate([OPENING, tail])})
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) is None


def test_no_file_is_read_while_a_mind_of_the_tenant_is_in_a_slot_or_ram() -> None:
    on_disk = mind_key("a", "on-disk")
    seeds, registry = _seeds({on_disk: OPENING})
    registry.seated(mind_key("a", "resident"), 0)
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) is None
    seeds, _ = _seeds({on_disk: OPENING})
    put_page(seeds.store, mind_key("a", "in-ram"), 16)
    assert seeds.donor(mind_key("a", "new"), _prompt(OPENING)) is None
    assert seeds.donor(mind_key("b", "new"), _prompt(OPENING)) is None  # (b has no mind)
