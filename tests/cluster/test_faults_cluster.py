"""Faults between replicas and Redis, on a real cluster: two `kvswap serve` replicas on a tiny
model behind HAProxy, each reaching Redis (persistent: AOF) through a TCP fault proxy of its
own (`faultproxy`), every turn published (`--shared-tier-rpo-tokens 0`), leases of 1.5 s.

For each fault, while minds chat through HAProxy with the OpenAI client (no retries of its
own: every failure is looked at):
- every turn is answered, or refused with a typed 503 (`unavailable_error`) and `Retry-After`,
  and the client's retry is answered; no other error;
- every answer's text equals the fault-free run of the same conversation;
- no two owners ever held a mind's lease at once (the fence log, on Redis's clock), and a
  mind's manifest generation only grows (no torn or older generation ever replaces a newer);
- no mind loses more than the stated RPO: once the fault is over, the mind moves to the other
  replica (a hand-off) and its next turn prefills only its new tokens (the fault-free cache_n).

The faults: a reply lost after its command ran in Redis (redis-py sends the command again),
a 300 ms delay each way, connections reset, a blackhole (the owner cut off from Redis but not
from HAProxy, past its lease, while the other replica takes a mind over), a Redis restart
with its append-only file, a Redis full to `maxmemory`. (An owner SIGSTOPped past its lease:
`test_minds_cluster.py`, `test_a_frozen_owner_is_fenced_off_when_it_wakes`.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import openai
import pytest
import redis

from kvswap.core.keys import mind_key, namespace_of
from kvswap.tiers.shared import manifest
from kvswap.tiers.shared.keys import MindKeys
from tests.cluster import workload
from tests.cluster.faultproxy import Mode
from tests.cluster.replicas import Cluster, check_fence_log
from tests.cluster.util import wait_until
from tests.cluster.workload import ChatClient, Conversation, TurnResult

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
TURNS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("faults"), 2, ["--shared-tier-rpo-tokens", "0"],
        persistent_redis=True, proxied=True,
    )  # fmt: skip
    try:
        c.start()
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


@pytest.fixture(scope="module")
def baseline(cluster: Cluster) -> dict[tuple[int, int], TurnResult]:
    """The fault-free run of every conversation the tests use."""
    convs = [Conversation(i, f"base-{i}") for i in range(8)]
    return workload.run(cluster.url, convs, (*TURNS, 5), n_threads=2)


@pytest.fixture(autouse=True)
def _healthy(cluster: Cluster) -> Iterator[None]:
    yield
    for proxy in cluster.proxies.values():
        proxy.set(Mode.PASS)
    if not cluster.redis.proc.alive():
        cluster.redis.restart()
    cluster.redis.client().config_set("maxmemory", 0)


@dataclass
class Chat:
    """One mind chatting through HAProxy; each 503 it met is checked to be typed."""

    cluster: Cluster
    conv: Conversation
    client: ChatClient = field(init=False)
    n_unavailable: int = 0
    owner_id: str = ""  # the replica that took the mind at its first turn

    def __post_init__(self) -> None:
        self.client = ChatClient(self.cluster.url, retries=0)

    def turn(self, turn: int, deadline_s: float = 60) -> TurnResult:
        """The turn, sent again after each typed 503 (as the OpenAI client does, honouring
        Retry-After) until answered."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                return workload.chat_turn(self.client, self.conv, turn)
            except workload.BrokenTurn as err:
                cause = err.__cause__
                assert isinstance(cause, openai.APIStatusError), err
                assert cause.status_code == 503, err
                assert float(cause.response.headers["retry-after"]) >= 1, err
                assert cause.body["type"] == "unavailable_error", cause.body  # type: ignore[index]
                self.n_unavailable += 1
                assert time.monotonic() < deadline, f"still 503 after {deadline_s} s: {err}"
                time.sleep(1)


def _keys(name: str) -> MindKeys:
    return MindKeys.of(mind_key(namespace_of(""), name))  # the servers run without keys


def _gen(r: redis.Redis, name: str) -> int:
    return int(r.hget(_keys(name).manifest, "gen") or 0)


def _owner_of(cluster: Cluster, name: str) -> str:
    holder = cluster.redis.client().get(_keys(name).lease) or b""
    return holder.split(b" ")[0].decode()


def _moved_with_no_reprefill(
    cluster: Cluster, chat: Chat, baseline: dict[tuple[int, int], TurnResult], turn: int
) -> None:
    """The fault is over: the mind's owner hands it off, the other replica takes it over from
    the tier, and the next turn prefills only its new tokens (the RPO: nothing lost)."""
    owner_id = chat.owner_id
    # after an outage longer than the lease, the owner takes its lease again (nobody wrote
    # the mind meanwhile)
    wait_until(lambda: _owner_of(cluster, chat.conv.name) == owner_id, 30, "the owner's lease")
    wait_until(
        lambda: (
            not cluster.replicas[owner_id].shared()["held"]
            or all(h["n_unpublished"] == 0 for h in cluster.replicas[owner_id].shared()["held"])
        ),
        60,
        "the owner's catch-up publication",
    )
    given = cluster.replicas[owner_id].http.post("/cluster/handoff", json={"mind": chat.conv.name})
    assert given.json()["handed_off"] is True, given.text
    other_id = next(rid for rid in cluster.replicas if rid != owner_id)
    done = workload.chat_turn(ChatClient(cluster.replicas[other_id].url), chat.conv, turn)
    want = baseline[(chat.conv.index, turn)]
    assert done.replica == other_id
    assert (done.text, done.cache_n, done.prompt_n) == (want.text, want.cache_n, want.prompt_n)


Fault = Callable[[str], contextlib.AbstractContextManager[object]]


def _chat_through(
    cluster: Cluster,
    baseline: dict[tuple[int, int], TurnResult],
    index: int,
    name: str,
    fault: Fault,
    before_turn: Callable[[str], None] = lambda _: None,
) -> Chat:
    """Turn 1 fault-free, turns 2-4 inside `fault(owner_id)` (`before_turn(owner_id)` before
    each); each answer checked against the fault-free run and the mind's generations against
    going back."""
    chat = Chat(cluster, Conversation(index, name))
    r = cluster.redis.client()
    chat.turn(1)
    owner_id = chat.owner_id = _owner_of(cluster, name)
    gens = [_gen(r, name)]
    with fault(owner_id):
        for turn in TURNS[1:]:
            before_turn(owner_id)
            done = chat.turn(turn)
            assert done.text == baseline[(index, turn)].text, (turn, done)
            with contextlib.suppress(redis.exceptions.RedisError):
                gens.append(_gen(r, name))
    gens.append(_gen(r, name))
    assert gens == sorted(gens), gens
    return chat


@pytest.mark.parametrize("fault", ["lost_reply", "delay", "reset"])
def test_a_lost_reply_a_delay_and_resets_on_the_owners_link(
    cluster: Cluster, baseline: dict[tuple[int, int], TurnResult], fault: str
) -> None:
    """A reply lost after its command ran (each turn's: redis-py sends it again, and every
    write is idempotent), 300 ms each way, every connection reset (Redis away for this
    replica: its held mind keeps answering, its writes wait and catch up)."""
    index = {"lost_reply": 0, "delay": 1, "reset": 2}[fault]
    dropped = [0]

    @contextlib.contextmanager
    def faulty(owner_id: str) -> Iterator[None]:
        proxy = cluster.proxies[owner_id]
        if fault == "delay":
            proxy.set(Mode.DELAY, delay_ms=300)
        elif fault == "reset":
            proxy.set(Mode.RESET)
        try:
            yield
        finally:
            dropped[0] = proxy.n_replies_dropped
            proxy.set(Mode.PASS)

    def lose_a_reply(owner_id: str) -> None:
        if fault == "lost_reply":
            cluster.proxies[owner_id].set(Mode.DROP_REPLY, n_drops=1)

    chat = _chat_through(cluster, baseline, index, f"{fault}-{index}", faulty, lose_a_reply)
    if fault == "lost_reply":
        assert dropped[0] >= 3
    _moved_with_no_reprefill(cluster, chat, baseline, 5)
    assert check_fence_log(cluster.fence_log) > 0


def test_an_owner_cut_off_from_redis_but_not_from_haproxy(
    cluster: Cluster, baseline: dict[tuple[int, int], TurnResult]
) -> None:
    """The owner keeps serving its mind through HAProxy with its writes held back; its lease
    lapses in Redis, the other replica takes the mind over from the tier when a turn reaches
    it there, and when the owner is back every write it tries is refused by the fence."""
    index, name = 3, "cutoff-3"
    chat = Chat(cluster, Conversation(index, name))
    chat.turn(1)
    owner_id = _owner_of(cluster, name)
    owner, proxy = cluster.replicas[owner_id], cluster.proxies[owner_id]
    other_id = next(rid for rid in cluster.replicas if rid != owner_id)
    r = cluster.redis.client()
    proxy.set(Mode.BLACKHOLE)
    done = chat.turn(2)  # through HAProxy, served by the owner from its slot
    assert done.replica == owner_id and done.text == baseline[(index, 2)].text
    wait_until(lambda: r.get(_keys(name).lease) is None, 30, "the owner's lease to lapse")
    gen_before = _gen(r, name)
    taken = workload.chat_turn(ChatClient(cluster.replicas[other_id].url), chat.conv, 3)
    assert taken.replica == other_id
    # turn 2 never reached the tier: the new owner prefilled it again, its answer rendered
    # from the text the client sent (no record of the model's own tokens reached the tier)
    same = workload.agree(taken, baseline[(index, 3)], prompt_may_differ=True)
    assert _owner_of(cluster, name) == other_id and _gen(r, name) > gen_before
    proxy.set(Mode.PASS)
    # the owner, back, finds its lease gone: it lets the mind go (any write it tries is
    # refused by the fence), and the mind's turns through HAProxy reach its new owner
    wait_until(
        lambda: all(h["mind"] != name for h in owner.shared()["held"]), 30, "the owner to let go"
    )
    done = chat.turn(4)  # forwarded to the new owner (then handed back, with no re-prefill)
    assert done.replica == other_id
    if same:  # (after a near tie the conversation is its own)
        workload.agree(done, baseline[(index, 4)])
    record = manifest.decode(r.hget(_keys(name).manifest, "body") or b"")
    assert record.replica_id == other_id  # nothing of the old owner's landed
    threads = owner.http.get("/health").json()["threads"]  # and its tier's threads kept going
    assert {t["name"] for t in threads if t["alive"]} == {"kvswap-leases", "kvswap-publish"}
    assert check_fence_log(cluster.fence_log) > 0


def test_a_redis_restart_with_its_append_only_file(
    cluster: Cluster, baseline: dict[tuple[int, int], TurnResult]
) -> None:
    """Held minds keep answering while Redis is down; a mind no replica holds gets a typed 503
    until it is back; the AOF keeps every published page (a takeover after the restart
    prefills only new tokens)."""
    index, name = 4, "restart-4"

    @contextlib.contextmanager
    def down(_: str) -> Iterator[None]:
        cluster.redis.stop()
        fresh = Chat(cluster, Conversation(5, "while-down-5"))
        with pytest.raises(AssertionError, match="still 503"):
            fresh.turn(1, deadline_s=3)
        assert fresh.n_unavailable >= 1
        try:
            yield
        finally:
            cluster.redis.restart()

    chat = _chat_through(cluster, baseline, index, name, down)
    _moved_with_no_reprefill(cluster, chat, baseline, 5)
    assert check_fence_log(cluster.fence_log) > 0


def test_a_redis_full_to_maxmemory(
    cluster: Cluster, baseline: dict[tuple[int, int], TurnResult]
) -> None:
    """Redis refuses every write (noeviction at maxmemory): held minds keep answering, a new
    mind gets a typed 503; once there is room again, everything is published and served."""
    index, name = 6, "full-6"
    r = cluster.redis.client()

    @contextlib.contextmanager
    def full(_: str) -> Iterator[None]:
        for i in range(16):
            r.set(f"junk:{i}", b"x" * (256 << 10))
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", used - (2 << 20))  # full: noeviction refuses every write
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            r.set("one-more", b"x")
        fresh = Chat(cluster, Conversation(7, "while-full-7"))
        with pytest.raises(AssertionError, match="still 503"):
            fresh.turn(1, deadline_s=3)
        try:
            yield
        finally:
            r.config_set("maxmemory", 0)
            r.delete(*[f"junk:{i}" for i in range(16)])

    chat = _chat_through(cluster, baseline, index, name, full)
    _moved_with_no_reprefill(cluster, chat, baseline, 5)
    assert check_fence_log(cluster.fence_log) > 0
