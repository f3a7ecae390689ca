"""A mind's session on the CPU: its lock, busy mark, claim, read-back, restore barrier and
letting go, with the real `MindRegistry` and `PageStore`, and stand-ins for the demoter's
claims, the disk read, the engine's inbox and the shared tier.

Each test names the defect it would catch. The engine stand-in answers a `Nudge` only when the
test says so, so "freed only after the engine is done" is an order the test observes, not a
sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvswap.core.errors import ErrorKind, KvswapError, StoreOff
from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.core.types import Completion, EngineError, GenerationRequest
from kvswap.core.vocab import MindTier, ResumeSource
from kvswap.engine.commands import Nudge
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.registry import DiskCopy, MindRegistry
from kvswap.files import WrongModelError
from kvswap.minds.placement import TurnFacts
from kvswap.minds.session import HeldMind, MindSession
from kvswap.tiers.shared.replica import Resumed

NS = namespace_of("k")
ALICE, BOB = mind_key(NS, "alice"), mind_key(NS, "bob")


class FakeState:
    """A restored state: records when its buffers are let go."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def release(self) -> None:
        self.log.append(f"{self.name} released")


@dataclass
class FakeRead:
    """What the disk read hands back (`tiers.slotfiles.ReadState`'s surface)."""

    state: FakeState

    def close(self) -> None:
        self.state.release()


@dataclass
class World:
    """The session's surroundings, recording what happens to them in `log`."""

    log: list[str] = field(default_factory=list)
    registry: MindRegistry = field(default_factory=MindRegistry)
    store: PageStore = field(default_factory=lambda: PageStore(1 << 20))
    refuse_claim: bool = False
    read_error: Exception | None = None
    threads: set[str] = field(default_factory=set)
    nudges: list[Callable[[object], None]] = field(default_factory=list)
    nudged: asyncio.Event | None = None

    # -- the demoter's claims
    def owns(self, key: PageKey) -> bool:
        return False

    def own(self, key: PageKey) -> bool:
        self.threads.add(threading.current_thread().name)
        busy = not self.registry.idle([key])
        self.log.append(f"own {key.name} (busy {busy})")
        return not self.refuse_claim

    def settle(self, key: PageKey) -> None:
        self.log.append(f"settle {key.name} (busy {not self.registry.idle([key])})")

    def forget(self, key: PageKey) -> None:
        self.log.append(f"forget {key.name}")

    # -- the disk and the engine
    def read_back(self, key: PageKey) -> FakeRead:
        self.threads.add(threading.current_thread().name)
        self.log.append(f"read {key.name}")
        if self.read_error is not None:
            raise self.read_error
        return FakeRead(FakeState(self.log, f"{key.name}'s disk copy"))

    def post(self, command: object) -> None:
        assert isinstance(command, Nudge) and command.reply is not None
        self.log.append("nudge")
        self.nudges.append(command.reply)
        if self.nudged is not None:
            self.nudged.set()

    def answer_nudges(self) -> None:
        """The engine has handled every command posted so far (on its own thread)."""
        replies, self.nudges = self.nudges, []
        for reply in replies:
            threading.Thread(target=reply, args=(None,)).start()

    def on_disk(self, key: PageKey) -> None:
        self.registry.record_disk(key, DiskCopy(n_bytes=100, n_tokens=10, t_unix_s=1.0))


@dataclass
class FakeShared:
    """The shared tier's asyncio face: placement answers with `resumed`."""

    log: list[str]
    resumed: Resumed | None = None
    gate: asyncio.Event | None = None  # placement waits for it when set
    ended: list[dict[str, Any]] = field(default_factory=list)

    async def place(self, key: PageKey, facts: TurnFacts | None) -> tuple[Resumed, float]:
        self.log.append(f"place {key.name}")
        if self.gate is not None:
            await self.gate.wait()
        return self.resumed or Resumed(ResumeSource.HELD), 0.25

    async def turn_done(
        self, request: GenerationRequest, completion: Completion, **facts: Any
    ) -> Completion | EngineError:
        self.ended.append(facts)
        return completion


def _session(world: World, io: ThreadPoolExecutor, shared: FakeShared | None = None) -> MindSession:
    return MindSession(
        registry=world.registry,
        store=world.store,
        claims=world,
        post=world.post,
        snapshot=lambda: pytest.fail("no snapshot read"),
        io=io,
        read_back=world.read_back,
        shared=shared,  # type: ignore[arg-type]
    )


def _run(body: Callable[[World, MindSession], Awaitable[None]], shared: bool = False) -> World:
    world = World()

    async def main() -> None:
        world.nudged = asyncio.Event()
        with ThreadPoolExecutor(1, thread_name_prefix="io") as io:
            fake = FakeShared(world.log) if shared else None
            await body(world, _session(world, io, fake))

    asyncio.run(main())
    return world


def test_two_turns_of_one_mind_run_in_order_and_other_minds_do_not_wait() -> None:
    """Defect caught: two requests of one mind running at once (two slots taking one state),
    or one mind's turn making another mind wait."""

    async def body(world: World, minds: MindSession) -> None:
        first_in, release_first = asyncio.Event(), asyncio.Event()
        order: list[str] = []

        async def turn(key: PageKey, name: str, hold: asyncio.Event | None = None) -> None:
            async with minds.turn(key, None):
                order.append(f"{name} in")
                if hold is not None:
                    first_in.set()
                    await hold.wait()
                order.append(f"{name} out")

        first = asyncio.ensure_future(turn(ALICE, "alice 1", release_first))
        await first_in.wait()
        second = asyncio.ensure_future(turn(ALICE, "alice 2"))
        await turn(BOB, "bob")  # runs while alice 1 holds alice
        assert order == ["alice 1 in", "bob in", "bob out"]
        release_first.set()
        await asyncio.gather(first, second)
        assert order[3:] == ["alice 1 out", "alice 2 in", "alice 2 out"]

    _run(body)


def test_a_held_mind_is_busy_before_it_is_claimed_and_placed() -> None:
    """Defect caught: a claim (or a placement) taken while the mind is not marked busy, so the
    demoter's settle could drop what the turn is about to use; the claim is file I/O, so it
    runs on the I/O executor, never on the event loop."""

    async def body(world: World, minds: MindSession) -> None:
        async with minds.turn(ALICE, TurnFacts("t1")):
            assert not world.registry.idle([ALICE])
        assert world.registry.idle([ALICE]) == [ALICE]

    world = _run(body, shared=True)
    assert world.log == ["own alice (busy True)", "place alice", "settle alice (busy False)"]
    assert world.threads == {"io_0"}


def test_a_mind_another_server_claims_is_a_503_and_let_go() -> None:
    """Defect caught: a refused claim leaving the mind busy (never demoted again) or its lock
    taken (its next turn hanging)."""

    async def body(world: World, minds: MindSession) -> None:
        world.refuse_claim = True
        with pytest.raises(KvswapError) as err:
            async with minds.turn(ALICE, None):
                pytest.fail("a refused mind's turn ran")
        assert err.value.kind is ErrorKind.UNAVAILABLE
        assert "another server sharing the save path" in err.value.message
        world.refuse_claim = False
        async with asyncio.timeout(5), minds.turn(ALICE, None):
            pass  # the lock is free

    world = _run(body)
    assert world.log[:2] == ["own alice (busy True)", "settle alice (busy False)"]


def test_a_mind_made_by_another_model_is_refused_and_its_file_kept() -> None:
    """Defect caught: a mind spilled under other KV types served (garbage state) or written
    over (the other server's mind lost)."""

    async def body(world: World, minds: MindSession) -> None:
        world.registry.record_foreign(ALICE, "model x, KV q8_0")
        with pytest.raises(KvswapError) as err:
            async with minds.turn(ALICE, None):
                pytest.fail("a foreign mind's turn ran")
        assert err.value.kind is ErrorKind.INVALID_REQUEST
        assert "model x, KV q8_0" in err.value.message

    world = _run(body)
    assert not any(line.startswith("forget") or line.startswith("read") for line in world.log)


def test_a_mind_on_disk_only_is_read_back_once_and_freed_after_the_engine() -> None:
    """Defect caught: the read-back buffers freed while the engine may still copy them into a
    slot (a use after free), or read on the event loop; the barrier is one Nudge."""

    async def body(world: World, minds: MindSession) -> None:
        world.on_disk(ALICE)
        assert world.nudged is not None

        async def the_turn() -> None:
            async with minds.turn(ALICE, None) as held:
                state = await minds.restore(held)
                assert isinstance(state, FakeState) and state.name == "alice's disk copy"

        running = asyncio.ensure_future(the_turn())
        await world.nudged.wait()
        assert "alice's disk copy released" not in world.log  # the engine has not answered
        world.answer_nudges()
        await running

    world = _run(body)
    assert world.log == [
        "own alice (busy True)",
        "read alice",
        "nudge",
        "alice's disk copy released",
        "settle alice (busy False)",
    ]
    assert world.threads == {"io_0"}


def test_a_turn_that_never_reached_the_engine_reads_nothing_and_posts_no_barrier() -> None:
    """Decision: a mind on disk whose request failed before it was submitted (a 400 in its
    preparation) costs no disk read and no engine round trip."""

    async def body(world: World, minds: MindSession) -> None:
        world.on_disk(ALICE)
        with pytest.raises(KvswapError):
            async with minds.turn(ALICE, None):
                raise KvswapError(ErrorKind.INVALID_REQUEST, "bad body")

    world = _run(body)
    assert world.log == ["own alice (busy True)", "settle alice (busy False)"]


def test_a_mind_in_ram_or_new_is_not_read_back() -> None:
    """Defect caught: a disk read for a mind the engine has in RAM (a stale state applied over
    a newer page) or for a new mind."""

    async def body(world: World, minds: MindSession) -> None:
        async with minds.turn(BOB, None) as held:
            assert await minds.restore(held) is None
        assert minds.tier(BOB) is None

    world = _run(body)
    assert "read bob" not in world.log and "nudge" not in world.log


def test_a_disk_copy_of_other_kv_types_starts_the_mind_from_its_prompt() -> None:
    """Decision: a copy the engine cannot load (another model or KV types since it was
    written) is re-prefilled, logged, not a failed turn."""

    async def body(world: World, minds: MindSession) -> None:
        world.on_disk(ALICE)
        world.read_error = WrongModelError("alice", "model f16", "model q8_0")
        async with minds.turn(ALICE, None) as held:
            assert await minds.restore(held) is None

    world = _run(body)
    assert world.log == ["own alice (busy True)", "read alice", "settle alice (busy False)"]


def test_a_turn_cancelled_while_it_is_placed_still_lets_the_mind_go() -> None:
    """Defect caught: a client gone while its turn waits for the mind's lease leaving the mind
    busy and unsettled (its RAM page never demoted, its claim never released)."""

    async def body(world: World, minds: MindSession) -> None:
        assert minds.shared is not None
        fake: FakeShared = minds.shared  # type: ignore[assignment]
        fake.gate = asyncio.Event()  # placement never returns

        async def the_turn() -> None:
            async with minds.turn(ALICE, None):
                pytest.fail("a cancelled turn ran")

        running = asyncio.ensure_future(the_turn())
        while "place alice" not in world.log:
            await asyncio.sleep(0)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert world.registry.idle([ALICE]) == [ALICE]

    world = _run(body, shared=True)
    assert world.log[-1] == "settle alice (busy False)"


def test_a_resumed_state_goes_to_the_engine_before_any_disk_copy() -> None:
    """Defect caught: a mind taken over in a cluster restored from this replica's older disk
    copy instead of the shared tier's page; the page is freed after the engine's barrier."""

    async def body(world: World, minds: MindSession) -> None:
        world.on_disk(ALICE)
        assert minds.shared is not None
        fake: FakeShared = minds.shared  # type: ignore[assignment]
        fake.resumed = Resumed(ResumeSource.TIER, state=FakeState(world.log, "the tier's page"))  # type: ignore[arg-type]
        world.registry.restored(ALICE, 12.0)

        async def the_turn() -> HeldMind:
            async with minds.turn(ALICE, TurnFacts("t9")) as held:
                state = await minds.restore(held)
                assert isinstance(state, FakeState) and state.name == "the tier's page"
                done: Any = object()  # passed through to the shared tier untouched
                request = GenerationRequest(prompt_tokens=(), mind=ALICE)
                assert await minds.turn_done(held, request, done) is done
                return held

        running = asyncio.ensure_future(the_turn())
        assert world.nudged is not None
        await world.nudged.wait()
        world.answer_nudges()
        held = await running
        assert held.lease_wait_s == 0.25
        assert fake.ended == [
            {"facts": TurnFacts("t9"), "resumed": fake.resumed, "lease_wait_s": 0.25,
             "restore_ms": 12.0}
        ]  # fmt: skip

    world = _run(body, shared=True)
    assert "read alice" not in world.log
    assert world.log[-3:] == ["nudge", "the tier's page released", "settle alice (busy False)"]


def test_minds_need_the_page_store() -> None:
    """A server without a page store (`--page-ram-bytes 0`) refuses a mind's turn, typed."""

    async def body(world: World, minds: MindSession) -> None:
        minds.store = None
        with pytest.raises(StoreOff):
            async with minds.turn(ALICE, None):
                pass

    world = _run(body)
    assert world.log == []


def test_where_a_mind_lives() -> None:
    """The tier a mind is found in, as the mind verbs and /pages report it."""

    async def body(world: World, minds: MindSession) -> None:
        world.on_disk(ALICE)
        assert minds.tier(ALICE) is MindTier.DISK
        assert minds.disk_bytes(NS) == 100 and minds.disk_bytes(namespace_of("other")) == 0

    _run(body)
