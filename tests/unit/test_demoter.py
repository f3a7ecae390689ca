"""The demoter's choices (`tiers.demoter.Demoter`) on the CPU, one pass at a time.

The demoter runs against the engine side's real owners (`standins.EngineSide`: page store, mind
registry, flush schedule, hand-offs, anonymous cache, seating), which answers its commands as
the engine thread would, and writes real files with fsync into a temporary save path. A test
calls `run_pass` where the thread would, so every decision is made in the test's order: no
thread, no sleep, no model. The flush schedule runs on the test's clock, so "changed 60 s ago"
is exact.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kvswap.core.keys import PageKey, mind_key
from kvswap.core.page import PageGeometry
from kvswap.engine.commands import Command, FlushMinds
from kvswap.engine.seats.handoffs import Handed
from kvswap.engine.seats.outcomes import NoRoomYet
from kvswap.engine.seats.registry import DiskCopy
from kvswap.files import Publisher
from kvswap.tiers.demoter import Demoter, MindPolicy
from kvswap.tiers.mindfiles import file_name, open_minds
from kvswap.tiers.slotfiles import publish_state
from tests.unit.standins import (
    GEOMETRY,
    NS,
    EngineSide,
    engine_side,
    fill,
    layout_of,
    page_bytes,
    page_tokens,
    put_page,
    tokens,
)

N = 1000  # tokens of each test mind
PAGE = page_bytes(N)  # 12,000 bytes


class Clock:
    """The flush schedule's clock, moved by the test."""

    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


def _m(name: str) -> PageKey:
    return mind_key(NS, name)


def _side(ceiling_bytes: int = 4 * PAGE, clock: Clock | None = None) -> EngineSide:
    return engine_side(ceiling_bytes=ceiling_bytes, clock=clock or time.time)


def _demoter(
    side: EngineSide,
    save_dir: Path | None,
    *,
    disk_bytes: int | None = None,
    drop_lru: bool = False,
    flush_s: float = 0.0,
    post: Callable[[Command], None] | None = None,
) -> Demoter:
    slot_files = Publisher(save_dir) if save_dir is not None else None  # as a server opens it
    return Demoter(
        pages=side.pages,
        post=post or side.post,
        publisher=open_minds(save_dir) if save_dir is not None else None,
        save_dir=save_dir,
        policy=MindPolicy(disk_bytes, drop_lru, flush_s),
        slot_files=slot_files,
    )


def _in_ram(side: EngineSide, *names_by_age: str) -> list[PageKey]:
    """Mind pages of N tokens, least recently used first (as their last turns left them)."""
    keys = []
    for age, name in enumerate(names_by_age):
        key = _m(name)
        put_page(side.store, key, N, start=1000 * age)
        side.registry.touch(key, when_unix_s=100.0 + age)
        side.flushes.changed(key)
        keys.append(key)
    return keys


def _on_disk(
    side: EngineSide, publisher: Publisher, name: str, when_s: float, namespace: str = NS
) -> PageKey:
    """Mind `name` spilled earlier: its file of N tokens, in the registry's disk index."""
    key = mind_key(namespace, name)
    layout = layout_of(N)
    buffer = bytearray(layout.n_bytes)
    fill(buffer, layout, tokens(N))
    receipt = publish_state(publisher, file_name(key), buffer, layout)
    side.registry.record_disk(key, DiskCopy(receipt.n_bytes, N, when_s))
    side.registry.touch(key, when_unix_s=when_s)
    return key


def _files(d: Demoter) -> dict[str, str]:
    """The minds' folder: file name -> its committed generation."""
    assert d.publisher is not None
    return {i.name: i.generation for i in d.publisher.list_generations()}


def _counts(side: EngineSide) -> dict[str, float]:
    return {k: v for k, v in side.registry.metrics().items() if v}


def test_headroom_spills_the_least_recently_used_idle_minds_until_it_is_free(
    tmp_path: Path,
) -> None:
    """Decision: the demoter frees the headroom (here the largest mind page seen, two pages) by
    spilling idle mind pages least recently used first, and no more than that; each spilled
    page leaves RAM and its file holds it."""
    side = _side()
    old, mid, new, newest = _in_ram(side, "old", "mid", "new", "newest")
    side.store.saw_mind_page(2 * PAGE)
    d = _demoter(side, tmp_path)
    report = d.run_pass()
    assert report.refused == "" and side.store.charged_bytes <= 2 * PAGE
    assert set(_files(d)) == {file_name(old), file_name(mid)}
    assert not side.store.has(old) and not side.store.has(mid)
    assert side.store.has(new) and side.store.has(newest)
    copy = side.registry.disk_copy(old)
    assert copy is not None and copy.n_tokens == N
    assert _counts(side)["mind_spills_total"] == 2
    d.close(engine_alive=False)


def test_a_page_already_current_on_disk_leaves_ram_without_a_write(tmp_path: Path) -> None:
    """Decision (issue 32): a mind page whose disk copy already holds its state (written
    behind by a flush, nothing changed since) is dropped for room without being written again:
    at a gigabyte a page that write and its fsync cost seconds. A changed page is written."""
    side = _side()
    old, mid, new, newest = _in_ram(side, "old", "mid", "new", "newest")
    d = _demoter(side, tmp_path)
    assert d.publisher is not None
    page = side.store.hold(old)  # old's flush: its page written as it is
    try:
        publish_state(d.publisher, file_name(old), page.buffer, page.layout)
    finally:
        side.store.release(page)
    side.registry.record_disk(old, DiskCopy(PAGE, N, time.time()))
    side.flushes.flushed(old, time.time())
    written = _files(d)[file_name(old)]
    side.store.saw_mind_page(2 * PAGE)
    assert d.run_pass().refused == ""
    files = _files(d)
    assert files[file_name(old)] == written  # not written again
    assert file_name(mid) in files  # changed since its last copy: written
    assert not side.store.has(old) and not side.store.has(mid)
    assert side.store.has(new) and side.store.has(newest)
    d.close(engine_alive=False)


def test_the_anonymous_cache_gives_way_before_any_mind_is_spilled(tmp_path: Path) -> None:
    """Decision: cached anonymous prompts are dropped (never written) before a mind's page is
    spilled; a pass whose shed frees the headroom spills nothing."""
    side = _side()
    side.with_cache(-1)
    slot = side.slots[1]
    slot.tokens.append(tokens(N, start=50_000))
    side.anon.expect(slot)
    side.anon.save(slot, ask_next=False)
    ann, bob = _in_ram(side, "ann", "bob")
    side.store.saw_mind_page(2 * PAGE)  # the headroom needs the cache's bytes, and no more
    d = _demoter(side, tmp_path)
    assert d.run_pass().refused == ""
    assert _files(d) == {} and side.store.has(ann) and side.store.has(bob)
    assert side.anon.best(slot.tokens.view(), slot.namespace) is None  # shed
    side.check()
    d.close(engine_alive=False)


def test_a_busy_mind_is_never_spilled_for_room(tmp_path: Path) -> None:
    """Defect caught: the demoter dropping the page of a mind whose request is reading it. The
    least recently used mind is busy: the next one goes instead; when every mind is busy the
    pass reports why it could not make room."""
    side = _side()
    old, mid, _, _ = _in_ram(side, "old", "mid", "new", "newest")
    side.registry.set_busy(old, True)
    d = _demoter(side, tmp_path)
    d.run_pass()
    assert set(_files(d)) == {file_name(mid)} and side.store.has(old)
    side.store.saw_mind_page(4 * PAGE)  # the whole store: every page would have to go
    for key in (k.key for k in side.store.infos()):
        side.registry.set_busy(key, True)
    assert d.run_pass().refused == "no idle mind page can be spilled to disk now"
    d.close(engine_alive=False)


def test_without_a_disk_tier_the_pass_says_so() -> None:
    side = _side()
    _in_ram(side, "old", "mid", "new", "newest")
    d = _demoter(side, None)
    assert d.run_pass().refused == "there is no disk tier to spill to (--slot-save-path)"
    assert side.store.n_pages == 4
    d.close(engine_alive=False)


def test_a_full_disk_budget_refuses_the_spill_naming_both_flags(tmp_path: Path) -> None:
    """Decision: without --page-disk-drop-lru a full --page-disk-bytes refuses the spill (the
    page stays in RAM), with a reason naming both flags that the waiting switch reports."""
    side = _side()
    d = _demoter(side, tmp_path, disk_bytes=PAGE + PAGE // 2)
    assert d.publisher is not None
    _on_disk(side, d.publisher, "spilled", when_s=50.0)
    old, *_ = _in_ram(side, "old", "mid", "new", "newest")
    report = d.run_pass()
    assert f"--page-disk-bytes {PAGE + PAGE // 2}" in report.refused
    assert "--page-disk-drop-lru" in report.refused
    assert side.store.has(old) and set(_files(d)) == {file_name(_m("spilled"))}
    assert _counts(side)["mind_disk_refused_total"] == 1
    d.close(engine_alive=False)


def test_drop_lru_drops_the_least_recently_used_idle_spilled_minds_for_room(
    tmp_path: Path,
) -> None:
    """Decision: with --page-disk-drop-lru the oldest idle spilled minds lose their files until
    the spill fits; a busy mind's copy is never dropped; a dropped mind that lives nowhere else
    is forgotten (its name costs nothing)."""
    side = _side()
    minds = open_minds(tmp_path)
    # Names in another order than their age: the drop follows last use, not names.
    oldest = _on_disk(side, minds, "m-oldest", when_s=10.0)
    older = _on_disk(side, minds, "z-older", when_s=20.0)
    recent = _on_disk(side, minds, "a-recent", when_s=30.0)
    side.registry.set_busy(oldest, True)  # a request reads it back now
    old, *_ = _in_ram(side, "old", "mid", "new", "newest")
    files = side.registry.disk_copies()
    # Room for the spill once exactly one copy (the oldest idle one: `older`) is gone.
    bound = sum(c.n_bytes for c in files.values()) - files[older].n_bytes + PAGE
    d = _demoter(side, tmp_path, disk_bytes=bound, drop_lru=True)
    assert d.run_pass().refused == ""
    files = set(_files(d))
    assert file_name(old) in files and file_name(oldest) in files and file_name(recent) in files
    assert file_name(older) not in files and side.registry.disk_copy(older) is None
    assert side.registry.last_used().get(older) is None  # forgotten: it lives nowhere
    assert _counts(side)["mind_disk_dropped_total"] == 1
    d.close(engine_alive=False)


def test_a_retention_floor_keeps_a_spilled_mind_until_it_has_passed(tmp_path: Path) -> None:
    """Decision (Anthropic's cache_control as a retention floor): a full disk tier with
    --page-disk-drop-lru drops the least recently used spilled mind no floor keeps. A mind
    whose 5-minute breakpoint was set a minute ago keeps its copy though it is the oldest;
    six minutes later it is an ordinary least recently used mind, and goes first."""
    clock = Clock()
    side = _side(clock=clock)
    minds = open_minds(tmp_path)
    kept = _on_disk(side, minds, "kept", when_s=10.0)
    side.registry.retain(kept, 300)
    other = _on_disk(side, minds, "other", when_s=20.0)
    bound = sum(c.n_bytes for c in side.registry.disk_copies().values())  # full: one must go
    d = _demoter(side, tmp_path, disk_bytes=bound, drop_lru=True)
    clock.now_s += 60
    _in_ram(side, "old", "mid", "new", "newest")
    assert d.run_pass().refused == ""
    assert file_name(kept) in _files(d) and file_name(other) not in _files(d)
    clock.now_s += 360
    _in_ram(side, "later")
    assert d.run_pass().refused == ""
    assert file_name(kept) not in _files(d)
    assert _counts(side)["mind_disk_dropped_total"] == 2
    d.close(engine_alive=False)


def test_floors_past_half_the_disk_budget_give_way_so_the_spill_fits(tmp_path: Path) -> None:
    """Decision (audit F1: 14 Claude Code sessions with 5-minute floors froze the server):
    retention floors keep at most half of --page-disk-bytes. When every spilled mind is under a
    floor and the disk is full, the least recently used floored minds past that half go, and
    the spill fits; the floors within the half are kept."""
    clock = Clock()
    side = _side(clock=clock)
    minds = open_minds(tmp_path)
    floored = [_on_disk(side, minds, f"s{i}", when_s=10.0 + i) for i in range(4)]
    for key in floored:
        side.registry.retain(key, 300)
    copy = side.registry.disk_copy(floored[0])
    assert copy is not None
    d = _demoter(side, tmp_path, disk_bytes=4 * copy.n_bytes + copy.n_bytes // 2, drop_lru=True)
    old, *_ = _in_ram(side, "old", "mid", "new", "newest")
    assert d.run_pass().refused == ""
    files = set(_files(d))
    assert file_name(old) in files
    assert file_name(floored[0]) not in files  # the least recently used floor gave way
    assert {file_name(k) for k in floored[2:]} <= files  # two copies: within half the budget
    d.close(engine_alive=False)


def test_one_tenants_floors_never_take_another_tenants_share(tmp_path: Path) -> None:
    """Decision (audit F1, per tenant): the floors' half of the disk budget is split between
    the tenants holding floors. Tenant B floors many minds, A one (its oldest of all): B's
    floors past B's share give way, A's floored mind keeps its copy."""
    clock = Clock()
    side = _side(clock=clock)
    minds = open_minds(tmp_path)
    a_kept = _on_disk(side, minds, "a", when_s=1.0, namespace="tenant-a")
    bs = [_on_disk(side, minds, f"b{i}", when_s=10.0 + i, namespace="tenant-b") for i in range(5)]
    for key in [a_kept, *bs]:
        side.registry.retain(key, 300)
    copy = side.registry.disk_copy(a_kept)
    assert copy is not None
    d = _demoter(side, tmp_path, disk_bytes=6 * copy.n_bytes + copy.n_bytes // 2, drop_lru=True)
    _in_ram(side, "old", "mid", "new", "newest")
    assert d.run_pass().refused == ""
    files = set(_files(d))
    assert file_name(a_kept) in files
    assert file_name(bs[0]) not in files and file_name(bs[-1]) in files
    d.close(engine_alive=False)


def _disk_held_by_requests(side: EngineSide, save_dir: Path) -> tuple[list[PageKey], int]:
    """Two spilled minds whose requests hold them, and a disk budget they fill."""
    minds = open_minds(save_dir)
    held = [_on_disk(side, minds, f"h{i}", when_s=10.0 + i) for i in range(2)]
    for key in held:
        side.registry.set_busy(key, True)
    return held, sum(c.n_bytes for c in side.registry.disk_copies().values())


def test_a_disk_held_by_requests_lets_the_idle_mind_in_ram_go_instead(tmp_path: Path) -> None:
    """Decision (minds waiting for a slot hold their spilled copies, so a switch behind them
    was refused while the flag allowed dropping an idle mind): with --page-disk-drop-lru and
    every copy on disk held by a request, the least recently used idle mind in RAM goes instead
    of a copy (its page and any older copy, counted as a drop), and the pass makes its room."""
    side = _side()
    held, bound = _disk_held_by_requests(side, tmp_path)
    d = _demoter(side, tmp_path, disk_bytes=bound, drop_lru=True)
    old, *_ = _in_ram(side, "old", "mid", "new", "newest")
    assert d.run_pass().refused == ""
    assert not side.store.has(old) and side.registry.disk_copy(old) is None
    assert side.registry.last_used().get(old) is None  # forgotten: it lives nowhere
    assert set(_files(d)) == {file_name(k) for k in held}  # the held copies are kept
    assert _counts(side)["mind_disk_dropped_total"] >= 1
    d.close(engine_alive=False)


def test_a_hand_off_refused_by_a_disk_held_by_requests_drops_the_mind_instead(
    tmp_path: Path,
) -> None:
    """Decision (as for a RAM page): a mind too large for the store, handed over from its slot
    while every copy on disk is held by a request, is dropped with --page-disk-drop-lru (the
    engine then clears its slot) rather than refusing the switch that moves it; without the
    flag, or while a request holds it, the hand-off is refused."""
    for drop_lru, busy, handed in (
        (True, False, Handed.DROPPED),
        (False, False, Handed.REFUSED),
        (True, True, Handed.REFUSED),
    ):
        side = _side(ceiling_bytes=2 * PAGE)
        save = tmp_path / f"{drop_lru}{busy}"
        save.mkdir()
        held, bound = _disk_held_by_requests(side, save)
        d = _demoter(side, save, disk_bytes=bound, drop_lru=drop_lru)
        big = side.seated(0, _m("big"), 3 * N).mind
        assert big is not None
        side.registry.set_busy(big, busy)
        assert _to_disk(side, d, big) is handed, (drop_lru, busy)
        assert set(_files(d)) == {file_name(k) for k in held}
        d.close(engine_alive=False)


def _to_disk(side: EngineSide, d: Demoter, key: PageKey) -> Handed | None:
    """Mind `key`, in slot 0 and too large for the store, sent to disk as a switch sends it:
    the engine's steps (`todisk`: ask for a file, fill it once opened) between demoter passes;
    how its hand-off ended."""
    slot, ceiling = side.slots[0], side.store.ceiling_bytes
    with pytest.raises(NoRoomYet):
        side.seating.to_disk.leave(slot, key, 0, ceiling)  # a file asked for
    d.run_pass()  # opened, or refused
    if side.handoffs.file_to_fill(key) is not None:
        with pytest.raises(NoRoomYet):
            side.seating.to_disk.leave(slot, key, 0, ceiling)  # filled
        d.run_pass()  # published
    return side.handoffs.state(key)


def test_a_disk_held_by_requests_and_floored_minds_in_ram_refuse_with_a_reason(
    tmp_path: Path,
) -> None:
    """Decision (audit F1: the switch waited for a reason that never came): with
    --page-disk-drop-lru and nothing that may go (every copy held by a request, every idle
    mind in RAM kept by a retention floor), the pass reports a reason naming
    --page-disk-bytes, which the waiting switch answers as a 503; the pages stay in RAM."""
    side = _side()
    held, bound = _disk_held_by_requests(side, tmp_path)
    d = _demoter(side, tmp_path, disk_bytes=bound, drop_lru=True)
    in_ram = _in_ram(side, "old", "mid", "new", "newest")
    for key in in_ram:
        side.registry.retain(key, 300)
    refused = d.run_pass().refused
    assert f"--page-disk-bytes {bound}" in refused and "in use by a request" in refused
    assert all(side.store.has(k) for k in in_ram) and set(_files(d)) == {file_name(k) for k in held}
    assert _counts(side)["mind_disk_refused_total"] >= 1
    d.close(engine_alive=False)


def test_a_ram_page_due_is_written_and_stays_in_ram_and_a_later_one_waits(tmp_path: Path) -> None:
    """--page-flush-seconds 60: a mind changed 60 s ago is written and keeps its RAM page
    (a flush is a copy, not a demotion); one changed 30 s ago is not written yet."""
    clock = Clock()
    side = _side(ceiling_bytes=8 * PAGE, clock=clock)
    early = _in_ram(side, "early")[0]
    clock.now_s += 30
    late = _in_ram(side, "late")[0]
    clock.now_s += 30
    side.registry.touch(late)  # a turn just now: the minds are not quiet
    d = _demoter(side, tmp_path, flush_s=60.0)
    d.run_pass()
    assert set(_files(d)) == {file_name(early)}
    assert side.store.has(early) and page_tokens(side.store, early) == tokens(N)
    assert not side.flushes.is_dirty(early) and side.flushes.is_dirty(late)
    assert _counts(side)["mind_flushes_total"] == 1
    d.close(engine_alive=False)


def test_a_resident_mind_due_is_copied_by_the_engine_and_keeps_its_slot(tmp_path: Path) -> None:
    """A mind due for a flush that sits in a slot is copied out by the engine (`FlushMinds`)
    and written; the slot keeps its state. A busy mind due waits: its turn changes it again."""
    clock = Clock()
    side = _side(ceiling_bytes=8 * PAGE, clock=clock)
    ann = side.seated(0, _m("ann"), 300).mind
    bob = side.seated(1, _m("bob"), 200).mind
    assert ann is not None and bob is not None
    side.registry.set_busy(bob, True)
    clock.now_s += 61
    d = _demoter(side, tmp_path, flush_s=60.0)
    d.run_pass()
    assert set(_files(d)) == {file_name(ann)}
    assert side.slots[0].tokens.view().tolist() == tokens(300)
    copy = side.registry.disk_copy(ann)
    assert copy is not None and copy.n_tokens == 300
    assert side.flushes.is_dirty(bob)
    d.close(engine_alive=False)


def test_a_flush_never_drops_another_minds_copy_for_room(tmp_path: Path) -> None:
    """Decision: a scheduled flush that does not fit the disk budget waits; even with
    --page-disk-drop-lru it never drops another mind's spilled copy (only a spill for room
    may)."""
    clock = Clock()
    side = _side(ceiling_bytes=8 * PAGE, clock=clock)
    d = _demoter(side, tmp_path, disk_bytes=PAGE + PAGE // 2, drop_lru=True, flush_s=60.0)
    assert d.publisher is not None
    other = _on_disk(side, d.publisher, "other", when_s=10.0)
    ann = _in_ram(side, "ann")[0]
    clock.now_s += 61
    side.registry.touch(ann)  # not quiet
    d.run_pass()
    assert set(_files(d)) == {file_name(other)} and side.flushes.is_dirty(ann)
    assert "mind_disk_dropped_total" not in _counts(side)
    d.forget(other)  # its client ends the other mind: room now
    clock.now_s += 61  # due again a window later, and written
    d.run_pass()
    assert set(_files(d)) == {file_name(ann)}
    d.close(engine_alive=False)


def test_once_the_minds_go_quiet_every_changed_mind_is_written(tmp_path: Path) -> None:
    """Decision: when no mind has been used for a second and none is busy, every changed mind
    is written at once, whatever its age (so a SIGKILL then loses none); once per quiet spell."""
    clock = Clock()
    side = _side(ceiling_bytes=8 * PAGE, clock=clock)
    keys = _in_ram(side, "ann", "bob")  # last used at 100 s and 101 s: long quiet
    d = _demoter(side, tmp_path, flush_s=3600.0)
    d.run_pass()
    assert set(_files(d)) == {file_name(k) for k in keys}
    assert not any(side.flushes.is_dirty(k) for k in keys)
    side.flushes.changed(keys[0])  # changed again, but in the same quiet spell
    before = _files(d)
    d.run_pass()
    assert _files(d) == before
    d.close(engine_alive=False)


def test_the_spill_before_exit_writes_changed_minds_and_skips_clean_ones(tmp_path: Path) -> None:
    """Defect caught (and its opposite): exit rewriting every mind (slow) or skipping one that
    changed since its copy (a restart then serves the older state). RAM pages and residents that
    changed are written; those whose disk copy is current keep their generation."""
    side = _side(ceiling_bytes=8 * PAGE)
    d = _demoter(side, tmp_path)
    assert d.publisher is not None
    ram_clean, ram_dirty = _in_ram(side, "ram-clean", "ram-dirty")
    slot_clean = side.seated(0, _m("slot-clean"), 50).mind
    slot_dirty = side.seated(1, _m("slot-dirty"), 60).mind
    assert slot_clean is not None and slot_dirty is not None
    for key in (ram_clean, slot_clean):
        _on_disk(side, d.publisher, key.name, when_s=time.time())
        side.flushes.flushed(key, time.time())
    for key in (ram_dirty, slot_dirty):
        _on_disk(side, d.publisher, key.name, when_s=time.time())  # an older copy
    before = _files(d)
    d.close(engine_alive=True)
    after = _files(d)
    assert after[file_name(ram_clean)] == before[file_name(ram_clean)]
    assert after[file_name(slot_clean)] == before[file_name(slot_clean)]
    assert after[file_name(ram_dirty)] != before[file_name(ram_dirty)]
    assert after[file_name(slot_dirty)] != before[file_name(slot_dirty)]
    copy = side.registry.disk_copy(slot_dirty)
    assert copy is not None and copy.n_tokens == 60


def test_without_a_disk_tier_exit_says_how_many_minds_are_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = _side()
    _in_ram(side, "ann")
    side.seated(0, _m("bob"), 5)
    caplog.set_level(logging.WARNING, "kvswap.demoter")
    _demoter(side, None).close(engine_alive=True)
    assert any("2 mind(s) are lost at exit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("fits", [True, False])
def test_a_mind_too_large_for_the_store_is_written_from_its_hand_off(
    tmp_path: Path, fits: bool
) -> None:
    """A mind larger than the store, captured by the engine into the file the demoter opened
    for it, is published as the mind's file and the hand-off says so (the engine then frees
    the slot); one that the disk budget refuses gets no file and is reported as not written
    (the engine's switch then fails, and the slot keeps the mind)."""
    side = _side(ceiling_bytes=2 * PAGE)
    d = _demoter(side, tmp_path, disk_bytes=10 * PAGE if fits else PAGE)
    big = side.seated(0, _m("big"), 3 * N).mind
    assert big is not None
    assert _to_disk(side, d, big) is (Handed.WRITTEN if fits else Handed.REFUSED)
    assert (file_name(big) in _files(d)) is fits
    copy = side.registry.disk_copy(big)
    assert (copy is not None and copy.n_tokens == 3 * N) is fits
    d.close(engine_alive=False)


def test_an_ended_mind_loses_its_files_and_every_entry(tmp_path: Path) -> None:
    """A slot verb ended the mind (erase, page_out): `forget` removes its files, its disk copy,
    its flush mark and its last use: no tier holds it and its name costs nothing."""
    side = _side()
    d = _demoter(side, tmp_path)
    assert d.publisher is not None
    ann = _on_disk(side, d.publisher, "ann", when_s=10.0)
    side.flushes.changed(ann)
    d.forget(ann)
    assert _files(d) == {} and side.registry.disk_copy(ann) is None
    assert not side.flushes.is_dirty(ann) and side.registry.metrics()["mind_entries"] == 0
    d.close(engine_alive=False)


def test_a_copy_taken_before_a_mind_ended_is_never_written(tmp_path: Path) -> None:
    """Defect caught: a flush copies a resident mind, a client erases the mind before the copy
    is written, and the write brings the erased mind back on disk."""
    clock = Clock()
    side = _side(ceiling_bytes=8 * PAGE, clock=clock)
    ann = side.seated(0, _m("ann"), 50).mind
    assert ann is not None
    demoter: list[Demoter] = []

    def post(cmd: Command) -> None:
        side.post(cmd)
        if isinstance(cmd, FlushMinds):  # the copy is out; the erase lands before its write
            side.seating.left(side.slots[0])
            demoter[0].forget(ann)

    clock.now_s += 61
    demoter.append(_demoter(side, tmp_path, flush_s=60.0, post=post))
    demoter[0].run_pass()
    assert _files(demoter[0]) == {} and side.registry.disk_copy(ann) is None
    side.check()
    demoter[0].close(engine_alive=False)


def test_a_mind_on_its_way_to_disk_is_not_forgotten(tmp_path: Path) -> None:
    """Defect caught: `settle` forgetting a mind whose only state is a hand-off in flight (no
    slot, no page, no file yet): its registry entry must outlive the hand-off."""
    side = _side()
    d = _demoter(side, tmp_path)
    ann = _m("ann")
    side.registry.touch(ann)
    side.handoffs.want_file(ann, layout_of(5))
    d.settle(ann)
    assert side.registry.metrics()["mind_entries"] == 1
    assert side.handoffs.take() is not None
    side.handoffs.end(ann)
    d.settle(ann)
    assert side.registry.metrics()["mind_entries"] == 0
    d.close(engine_alive=False)


def test_a_restart_serves_its_spilled_minds_and_keeps_another_models_aside(
    tmp_path: Path,
) -> None:
    """Start-up: a spilled mind is served (its token count read from its file's header); a
    mind spilled by a server with another model is kept on disk, never served or written over."""
    side = _side()
    minds = open_minds(tmp_path)
    ours, theirs = _m("ours"), _m("theirs")
    other = PageGeometry("another-model", "f16", "f16", n_stream=1, n_ctx_slot=4096)
    for key, layout in ((ours, layout_of(N)), (theirs, replace(layout_of(N), geometry=other))):
        buffer = bytearray(PAGE)
        fill(buffer, layout, tokens(N))
        publish_state(minds, file_name(key), buffer, layout)
    d = _demoter(side, tmp_path)
    d.start(GEOMETRY)
    copy = side.registry.disk_copy(ours)
    assert copy is not None and copy.n_tokens == N
    assert side.registry.disk_copy(theirs) is None
    assert side.registry.foreign(theirs) == "another model"
    d.close(engine_alive=False)
