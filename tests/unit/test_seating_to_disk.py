"""A mind that cannot be a page leaves its slot for its file with no copy in memory
(`engine.seats.todisk`, `engine.seats.handoffs`): the engine asks for a file, the demoter opens
it in place, the engine captures the slot into its mapping, the demoter publishes it, and only
then is the slot freed.

The engine's side is the real seating around slot verbs that move tokens (`standins`); the
demoter's side is played by hand with the real file functions (`tiers.slotfiles`) on a real
save path, so the file a switch leaves behind is read back: it must hold exactly the slot's
tokens. No libllama, no threads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey, mind_key, page_key
from kvswap.engine.commands import ALL_HELD, RoomReport, Submit
from kvswap.engine.seats.handoffs import FileFilled, FileWanted, Handed
from kvswap.engine.seats.outcomes import NoRoomYet
from kvswap.engine.seats.registry import DiskCopy
from kvswap.files import Publisher
from kvswap.files.publish import InPlace
from kvswap.tiers.mindfiles import file_name, tokens_on_disk
from kvswap.tiers.slotfiles import open_in_place, publish_in_place
from tests.unit.standins import NS, EngineSide, engine_side, put_page, submit, tokens


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _wait(side: EngineSide, cmd: Submit) -> None:
    with pytest.raises(NoRoomYet):
        side.seating.seat(side.slots[0], cmd)
    side.check()


def _open(side: EngineSide, files: Publisher, key: PageKey) -> InPlace:
    """The demoter's first step: the file the engine asked for, opened in place."""
    job = side.handoffs.take()
    assert job is not None and job.key == key and isinstance(job.what, FileWanted)
    staged = open_in_place(files, file_name(key), job.what.layout)
    assert side.handoffs.opened(key, staged)
    return staged


def _ask_open_fill(side: EngineSide, files: Publisher, key: PageKey, cmd: Submit) -> InPlace:
    """The switch waits while the engine asks for mind `key`'s file, the demoter opens it and
    the engine fills it; the file."""
    _wait(side, cmd)  # a file asked for
    staged = _open(side, files, key)
    _wait(side, cmd)  # filled
    return staged


def _filled(side: EngineSide, key: PageKey) -> tuple[FileFilled, float]:
    job = side.handoffs.take()
    assert job is not None and job.key == key and isinstance(job.what, FileFilled)
    return job.what, job.t_asked


def _publish(side: EngineSide, files: Publisher, key: PageKey) -> None:
    """The demoter's last step: the filled file published, recorded, reported."""
    filled, t_asked = _filled(side, key)
    receipt = publish_in_place(files, filled.staged, filled.layout)
    side.registry.record_disk(key, DiskCopy(receipt.n_bytes, filled.layout.n_tokens, t_asked))
    side.handoffs.done(key, Handed.WRITTEN)


def _big_in_slot(side: EngineSide, key: PageKey) -> Submit:
    """Mind `key` (1000 tokens, more than the store) in slot 0 with a disk tier; the switch
    of another mind that needs the slot."""
    side.handoffs.attach(lambda: None, disk_tier=True)
    side.seated(0, key, 1000)
    return submit(_m("bob"), tokens(5))[0]


def test_a_mind_larger_than_the_store_is_written_in_place_before_its_slot_is_freed(
    tmp_path: Path,
) -> None:
    """Defect caught: a mind that can never be a page losing its state, or costing a copy of
    itself outside the page budget. The slot keeps the mind while its file is opened, filled
    and published; then the switch goes on, and the file holds exactly the slot's tokens."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    rang: list[bool] = []
    cmd = _big_in_slot(side, big)
    side.handoffs.attach(lambda: rang.append(True), disk_tier=True)
    with Publisher(tmp_path) as files:
        _wait(side, cmd)  # a file asked for
        assert rang and side.handoffs.handing(big) and side.slots[0].mind == big
        _open(side, files, big)
        _wait(side, cmd)  # filled
        _wait(side, cmd)  # being published
        _publish(side, files, big)
        side.seating.seat(side.slots[0], cmd)
        side.check()
        assert side.registry.residents() == {_m("bob"): 0} and not side.handoffs.handing(big)
        assert tokens_on_disk(files, big).tolist() == tokens(1000)
    assert side.registry.metrics()["mind_too_large_total"] == 1


def test_a_failed_write_fails_the_switch_and_keeps_the_mind(tmp_path: Path) -> None:
    """Defect caught: a failed write losing the only copy. The switch fails, typed, naming
    --page-ram-bytes, and the slot still holds the mind."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    cmd = _big_in_slot(side, big)
    with Publisher(tmp_path) as files:
        _ask_open_fill(side, files, big, cmd)
        filled, _ = _filled(side, big)
        files.cancel_in_place(filled.staged)  # the demoter's write failed
        side.handoffs.done(big, Handed.REFUSED)
        with pytest.raises(KvswapError) as err:
            side.seating.seat(side.slots[0], cmd)
    assert err.value.kind is ErrorKind.UNAVAILABLE
    assert "--page-ram-bytes 8192" in err.value.message and "disk" in err.value.message
    assert side.slots[0].mind == big and len(side.slots[0].tokens) == 1000
    side.check()


def test_a_dropped_hand_off_frees_the_slot_for_the_switch() -> None:
    """Decision (--page-disk-drop-lru with a disk full of minds in use): the demoter let the
    mind go rather than open its file; the switch goes on and the slot no longer holds it."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    cmd = _big_in_slot(side, big)
    _wait(side, cmd)
    job = side.handoffs.take()
    assert job is not None and isinstance(job.what, FileWanted)
    side.handoffs.done(big, Handed.DROPPED)
    side.seating.seat(side.slots[0], cmd)
    assert side.slots[0].mind == _m("bob") and side.registry.resident_slot(big) is None
    side.check()


def test_a_mind_that_changed_since_its_file_was_written_asks_again(tmp_path: Path) -> None:
    """Decision: the slot is freed only when the file holds the slot's tokens; a file of an
    older state (the mind grew meanwhile) means another file, never a lost turn."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    cmd = _big_in_slot(side, big)
    with Publisher(tmp_path) as files:
        _ask_open_fill(side, files, big, cmd)
        _publish(side, files, big)
        side.registry.record_disk(big, DiskCopy(1, 999, 0.0))  # as if an older state landed
        _wait(side, cmd)
        again = side.handoffs.take()
    assert again is not None and isinstance(again.what, FileWanted)
    assert again.what.layout.n_tokens == 1000 and side.slots[0].mind == big


def test_a_mind_grown_past_its_file_drops_it_and_asks_for_a_larger_one(tmp_path: Path) -> None:
    """Decision: a mind whose slot grew while its file was opened is never cut to fit: the
    file goes back to the demoter to be dropped, and a file of the new size is asked for."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    cmd = _big_in_slot(side, big)
    with Publisher(tmp_path) as files:
        _wait(side, cmd)
        staged = _open(side, files, big)
        side.slots[0].tokens.replace(tokens(1200))  # a turn of the mind ran meanwhile
        _wait(side, cmd)
        dropped = side.handoffs.take()
        assert dropped is not None and dropped.key is None and dropped.what is staged
        files.cancel_in_place(staged)
        _wait(side, cmd)
        again = side.handoffs.take()
    assert again is not None and isinstance(again.what, FileWanted)
    assert again.what.layout.n_tokens == 1200 and side.slots[0].mind == big


def test_a_slot_verb_ending_the_mind_hands_its_open_file_back_to_be_dropped(
    tmp_path: Path,
) -> None:
    """Defect caught: a file opened for a hand-off that ended (an erase of the mind) left
    staged and mapped for the server's life. It is handed back, and the demoter drops it."""
    side = engine_side(ceiling_bytes=8192)
    big = _m("big")
    cmd = _big_in_slot(side, big)
    with Publisher(tmp_path) as files:
        _wait(side, cmd)
        staged = _open(side, files, big)
        assert side.seating.left(side.slots[0]) == big
        dropped = side.handoffs.take()
        assert dropped is not None and dropped.key is None and dropped.what is staged
        files.cancel_in_place(staged)
        assert files.list_generations() == []
    assert not list((tmp_path / ".kvswap" / "stage").iterdir())


def test_a_mind_the_full_store_cannot_take_goes_straight_to_disk_with_a_disk_tier(
    tmp_path: Path,
) -> None:
    """Defect caught (minds over half the RAM budget): a switch refused with a 503 while the
    disk tier had room, because the page the request holds and the outgoing page could not both
    be charged. With a disk tier, the refused switch sends the outgoing mind to its file and
    goes on once the file holds the slot's state; nothing is lost, nothing refused."""
    side = engine_side(ceiling_bytes=16384)
    ann, bob = _m("ann"), _m("bob")
    put_page(side.store, page_key(NS, "client"), 1340)  # 16080 of 16384 bytes, held
    side.seated(0, ann, 40)
    side.handoffs.attach(lambda: None, disk_tier=True)
    cmd = submit(bob, tokens(5))[0]
    with Publisher(tmp_path) as files:
        _wait(side, cmd)
        side.post(RoomReport(1, ALL_HELD))
        _wait(side, cmd)
        assert side.slots[0].mind == ann and side.handoffs.handing(ann)
        _open(side, files, ann)
        _wait(side, cmd)
        _publish(side, files, ann)
        side.seating.seat(side.slots[0], cmd)
        side.check()
        assert tokens_on_disk(files, ann).tolist() == tokens(40)
    assert side.registry.residents() == {bob: 0} and not side.handoffs.handing(ann)
    assert side.registry.disk_copy(ann) is not None
