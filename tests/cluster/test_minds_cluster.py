"""Minds across replicas with per-turn publication (`--shared-tier-rpo-tokens 0`): three real
replicas on a tiny model behind HAProxy, Redis between them.

- Affinity: 30 minds x 5 turns through HAProxy: each mind is served by one replica, no request
  fails, minds spread within 1.5x of the mean (the fault-free run every other test compares
  its text with).
- kill -9 of the replica holding the most minds, mid-workload: a broken turn is retried once;
  every mind finishes every turn with the fault-free text, and each moved mind prefills only
  its new tokens (its turns' cache_n and prompt_n are the fault-free run's).
- SIGSTOP an owner mid-turn past its lease: another replica takes the mind over and advances it
  two turns; SIGCONT: the old owner's writes are refused by the fence (counted), the mind's
  generation only grows, and two replicas never held its lease at once (the fence log).
- A flipped byte or a deleted chunk in Redis: a counted miss, a fallback (re-prefill), the
  same tokens as the fault-free run but at a near tie (`workload.agree`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import redis

from kvswap.core.keys import mind_key, namespace_of
from kvswap.tiers.shared import manifest
from kvswap.tiers.shared.keys import MindKeys
from tests.cluster import workload
from tests.cluster.replicas import Cluster, check_fence_log, running
from tests.cluster.util import wait_until
from tests.cluster.workload import Conversation, Results

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
N_MINDS, TURNS = 30, (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("cluster"), ["--shared-tier-rpo-tokens", "0"]) as c:
        yield c


@pytest.fixture(scope="module")
def baseline(cluster: Cluster) -> Results:
    """The fault-free run: 30 minds x 5 turns through HAProxy."""
    convs = [Conversation(i, f"base-{i}") for i in range(N_MINDS)]
    return workload.run(cluster.url, convs, TURNS)


@pytest.fixture(autouse=True)
def _all_up(cluster: Cluster) -> None:
    cluster.ensure_all_up()


def _placement(results: Results) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for (index, _), r in results.items():
        out.setdefault(index, set()).add(r.replica)
    return out


def test_each_mind_stays_on_one_replica_and_minds_spread(
    cluster: Cluster, baseline: Results
) -> None:
    assert len(baseline) == N_MINDS * len(TURNS)  # no request failed
    assert all(r.n_attempts == 1 for r in baseline.values())
    placement = _placement(baseline)
    assert all(len(replicas) == 1 for replicas in placement.values()), placement
    counts = Counter(next(iter(rs)) for rs in placement.values())
    mean = N_MINDS / len(cluster.replicas)
    print("minds per replica:", dict(counts))
    assert set(counts) == set(cluster.replicas)
    assert max(counts.values()) <= 1.5 * mean and min(counts.values()) >= mean / 1.5, counts
    for (index, turn), r in baseline.items():  # each turn after the first found its mind
        if turn > 1:
            assert r.cache_n > 0, (index, turn, r)


def _mind_keys(name: str) -> MindKeys:
    return MindKeys.of(mind_key(namespace_of(""), name))  # the servers run without keys


def _gen(r: redis.Redis, name: str) -> int:
    return int(r.hget(_mind_keys(name).manifest, "gen") or 0)


def _on(cluster: Cluster, replica_id: str, prefix: str, index: int) -> Conversation:
    """A fresh conversation `index` whose mind HAProxy routes to `replica_id` (after turn 1)."""
    c = workload.ChatClient(cluster.url)
    for n in range(40):
        conv = Conversation(index, f"{prefix}-{index}-{n}")
        if workload.chat_turn(c, conv, 1).replica == replica_id:
            return conv
    raise AssertionError(f"no mind name found that routes to {replica_id}")


def test_kill_9_of_the_busiest_replica_moves_its_minds_with_no_reprefill(
    cluster: Cluster, baseline: Results
) -> None:
    convs = [Conversation(i, f"kill-{i}") for i in range(N_MINDS)]
    results = workload.run(cluster.url, convs, (1,))
    victim, _ = Counter(r.replica for r in results.values()).most_common(1)[0]
    # the reference of a long turn, and a mind of the victim's that will be in that turn when
    # the victim dies
    ref = _on(cluster, "r1" if victim != "r1" else "r2", "ref", 7)
    c = workload.ChatClient(cluster.url)
    workload.chat_turn(c, ref, 2)
    ref_long = workload.stream_turn(c, ref, 3, n_predict=1200)
    doomed = _on(cluster, victim, "doomed", 7)
    workload.chat_turn(c, doomed, 2)

    half_done = threading.Event()
    n_done = [0]

    def after_turn(_: workload.TurnResult) -> None:
        n_done[0] += 1
        if n_done[0] >= N_MINDS:
            half_done.set()

    rest: list[Results] = []
    runner = threading.Thread(
        target=lambda: rest.append(
            workload.run(cluster.url, convs, (2, 3, 4, 5), after_turn=after_turn)
        )
    )
    runner.start()
    assert half_done.wait(300)
    t_kill = [0.0]

    def kill() -> None:
        cluster.replicas[victim].kill()
        t_kill[0] = time.monotonic()

    long = workload.stream_turn(c, doomed, 3, n_predict=1200, on_first=kill)
    runner.join(300)
    assert rest, "the workload failed (see its exception above)"
    results.update(rest[0])

    assert long.n_attempts == 2 and long.replica != victim  # broken once, resumed elsewhere
    assert (long.text, long.cache_n, long.prompt_n) == (
        ref_long.text,
        ref_long.cache_n,
        ref_long.prompt_n,
    )
    home = {i: results[(i, 1)].replica for i in range(N_MINDS)}
    moved = {i for (i, _), r in results.items() if r.replica != home[i]}
    assert moved and all(home[i] == victim for i in moved)
    for (i, turn), r in results.items():
        want = baseline[(i, turn)]
        assert r.text == want.text, (i, turn, r, want)
        if r.replica != home[i]:
            # after a move: only the new tokens were prefilled (fewer, when the dead replica
            # had published the very turn its client retried)
            assert r.prompt_n <= want.prompt_n, (i, turn, r, want)
            assert r.cache_n + r.prompt_n == want.cache_n + want.prompt_n, (i, turn, r, want)
        if r.t_sent > t_kill[0]:  # sent once the victim was dead: served elsewhere
            assert r.replica != victim, (i, turn, r, t_kill[0])
    survivors = [r for rid, r in cluster.replicas.items() if rid != victim]
    metrics = [r.metrics() for r in survivors]
    assert sum(m["shared_resumes_total"] for m in metrics) >= len(moved) + 1
    assert sum(m["shared_reprefilled_tokens_total"] for m in metrics) == 0
    assert check_fence_log(cluster.fence_log) > 0


def test_a_frozen_owner_is_fenced_off_when_it_wakes(cluster: Cluster, baseline: Results) -> None:
    index = 3
    c = workload.ChatClient(cluster.url)
    conv = Conversation(index, "frozen-3")
    owner_id = workload.chat_turn(c, conv, 1).replica
    workload.chat_turn(c, conv, 2)
    owner = cluster.replicas[owner_id]
    other_id = next(rid for rid in cluster.replicas if rid != owner_id)
    other = workload.ChatClient(cluster.replicas[other_id].url)
    r = cluster.redis.client()
    gens = [_gen(r, conv.name)]
    assert gens[0] > 0

    # the owner freezes in the middle of a turn sent to it directly, and stays frozen past
    # its lease while another replica takes the mind over and advances it two turns
    frozen = threading.Event()
    stale: dict[str, str] = {}

    def freeze() -> None:
        owner.signal(signal.SIGSTOP)
        frozen.set()

    def frozen_turn() -> None:
        late = Conversation(index, conv.name, list(conv.messages))
        try:
            workload.stream_turn(
                workload.ChatClient(owner.url),
                late,
                3,
                n_predict=1200,
                on_first=freeze,
                resend=False,
            )
        except workload.BrokenTurn as err:
            stale["error"] = str(err)

    waking = threading.Thread(target=frozen_turn)
    waking.start()
    try:
        assert frozen.wait(60)
        for turn in (3, 4):
            done = workload.chat_turn(other, conv, turn)
            want = baseline[(index, turn)]
            assert done.replica == other_id
            assert (done.text, done.cache_n, done.prompt_n) == (
                want.text,
                want.cache_n,
                want.prompt_n,
            )
            gens.append(_gen(r, conv.name))
    finally:
        owner.signal(signal.SIGCONT)
    waking.join(120)
    # the old owner's turn ends: its fenced write is refused, and the turn fails
    assert "lost the mind" in stale.get("error", ""), stale
    wait_until(lambda: owner.metrics()["shared_publish_stale_total"] >= 1, 30, "a refused write")
    gens.append(_gen(r, conv.name))
    done = workload.chat_turn(other, conv, 5)
    assert done.text == baseline[(index, 5)].text
    gens.append(_gen(r, conv.name))
    assert gens == sorted(gens) and gens[1] > gens[0] and gens[2] > gens[1], gens
    assert gens[3] == gens[2]  # nothing of the stale owner's landed
    holder = r.get(_mind_keys(conv.name).lease) or b""
    assert holder.split(b" ")[0].decode() == other_id
    assert check_fence_log(cluster.fence_log) > 0
    cluster.wait_status(owner_id, "UP")


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_chunk_is_a_counted_miss_and_the_text_is_unchanged(
    cluster: Cluster, baseline: Results, damage: str
) -> None:
    index = 5 if damage == "flip" else 6
    c = workload.ChatClient(cluster.url)
    conv = Conversation(index, f"damaged-{damage}")
    owner_id = workload.chat_turn(c, conv, 1).replica
    workload.chat_turn(c, conv, 2)
    r = cluster.redis.client()
    keys = _mind_keys(conv.name)
    record = manifest.decode(r.hget(keys.manifest, "body") or b"")
    chunk = keys.chunk(record.blobs[-1].gen, 0)
    if damage == "flip":
        at = (r.strlen(chunk) or 1) // 2
        r.setrange(chunk, at, bytes([(r.getrange(chunk, at, at) or b"\0")[0] ^ 0xFF]))
    else:
        assert r.delete(chunk) == 1
    # the owner gives the mind up; another replica takes it over from the tier
    taker_id, third_id = (rid for rid in cluster.replicas if rid != owner_id)
    given = cluster.replicas[owner_id].http.post("/cluster/handoff", json={"mind": conv.name})
    assert given.json()["handed_off"] is True
    taker = cluster.replicas[taker_id]
    reason = "chunk_corrupt" if damage == "flip" else "chunk_missing"
    before = taker.shared()["fetches"]["misses"].get(reason, 0)
    done = workload.chat_turn(workload.ChatClient(taker.url), conv, 3)
    assert taker.shared()["fetches"]["misses"].get(reason, 0) == before + 1
    assert done.replica == taker_id and done.cache_n == 0  # the fallback: a re-prefill
    # (of answers the fault-free run's decode steps computed: a near tie may tell)
    same = workload.agree(done, baseline[(index, 3)])
    # its next publication was whole: a third replica resumes it from the tier
    given = taker.http.post("/cluster/handoff", json={"mind": conv.name})
    assert given.json()["handed_off"] is True
    third = cluster.replicas[third_id]
    hits = third.shared()["fetches"]["n_hits"]
    done = workload.chat_turn(workload.ChatClient(third.url), conv, 4)
    want = baseline[(index, 4)]
    assert third.shared()["fetches"]["n_hits"] == hits + 1
    if same:  # (after a near tie the conversation is its own)
        assert (done.cache_n, done.prompt_n) == (want.cache_n, want.prompt_n)
        workload.agree(done, want)


def test_a_forwarded_turn_is_never_forwarded_again(cluster: Cluster, baseline: Results) -> None:
    c = workload.ChatClient(cluster.url)
    conv = Conversation(8, "hop-8")
    owner_id = workload.chat_turn(c, conv, 1).replica
    other = next(r for rid, r in cluster.replicas.items() if rid != owner_id)
    forwarded = other.shared()["resumes"]["n_forwarded"]
    body = {"messages": [*conv.messages, {"role": "user", "content": "hello"}], "max_tokens": 4}
    headers = {"X-Mind-Id": conv.name, "X-Kvswap-Hop": "r9"}  # as if r9 had forwarded it
    r = httpx.post(f"{other.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "unavailable_error"
    assert "not forwarded again" in r.json()["error"]["message"]
    assert other.shared()["resumes"]["n_forwarded"] == forwarded
    done = workload.chat_turn(c, conv, 2)  # the owner still has the mind as it was
    want = baseline[(8, 2)]
    assert (done.replica, done.text, done.cache_n) == (owner_id, want.text, want.cache_n)


def test_a_turn_sent_to_another_replica_is_forwarded_then_the_mind_handed_off(
    cluster: Cluster, baseline: Results
) -> None:
    index = 9
    conv = Conversation(index, "moving-9")
    owner_id = workload.chat_turn(workload.ChatClient(cluster.url), conv, 1).replica
    owner = cluster.replicas[owner_id]
    other_id, other = next((rid, r) for rid, r in cluster.replicas.items() if rid != owner_id)
    handoffs = owner.shared()["handoffs"]
    via_other = workload.ChatClient(other.url)
    # streamed to the replica that does not own the mind: the owner answers, through it
    done = workload.stream_turn(via_other, conv, 2, n_predict=workload.N_PREDICT, resend=False)
    want = baseline[(index, 2)]
    assert done.replica == owner_id
    assert (done.text, done.cache_n, done.prompt_n) == (want.text, want.cache_n, want.prompt_n)
    assert other.shared()["resumes"]["n_forwarded"] >= 1
    # ... which then hands the mind off, so the next turn runs where it was sent
    wait_until(lambda: owner.shared()["handoffs"] == handoffs + 1, 30, "the hand-off")
    assert cluster.redis.client().get(_mind_keys(conv.name).lease) is None
    done = workload.chat_turn(via_other, conv, 3)
    want = baseline[(index, 3)]
    assert done.replica == other_id
    assert (done.text, done.cache_n, done.prompt_n) == (want.text, want.cache_n, want.prompt_n)
    assert done.tier_before == "shared"  # the answer says where its mind came from


def test_an_erased_minds_slot_ends_the_mind_in_the_shared_tier_too(
    cluster: Cluster, baseline: Results
) -> None:
    conv = Conversation(10, "erased-10")
    c = workload.ChatClient(cluster.url)
    owner_id = workload.chat_turn(c, conv, 1).replica
    assert workload.chat_turn(c, conv, 2).cache_n > 0
    owner = cluster.replicas[owner_id]
    keys = _mind_keys(conv.name)
    r = cluster.redis.client()
    wait_until(lambda: r.exists(keys.manifest) == 1, 30, "the mind's publication")
    slots = httpx.get(f"{owner.url}/slots", timeout=30).json()
    slot_id = next(s["id"] for s in slots if s.get("mind") == conv.name)
    erased = httpx.post(f"{owner.url}/slots/{slot_id}?action=erase", timeout=30)
    assert erased.status_code == 200 and erased.json()["mind"] == conv.name
    # no tier holds it: its page, token log and lease are gone from Redis too
    assert [r.exists(k) for k in (keys.manifest, keys.tokens, keys.lease)] == [0, 0, 0]
    done = workload.chat_turn(c, conv, 3)  # starts the mind fresh: nothing to resume
    assert done.cache_n == 0, done


def test_a_mind_verb_sent_to_another_replica_reaches_the_owner(
    cluster: Cluster, baseline: Results
) -> None:
    """Audit A5: the web page's mind actions ran on whichever replica HAProxy picked; a drop
    there left the owner's slot, RAM and disk copies and the tier's page, and the 'dropped'
    conversation resumed at its next turn. Now the verb goes on to the owner, which drops the
    mind from every tier, the shared one included."""
    conv = Conversation(11, "verb-11")
    c = workload.ChatClient(cluster.url)
    owner_id = workload.chat_turn(c, conv, 1).replica
    assert workload.chat_turn(c, conv, 2).cache_n > 0
    other = next(r for rid, r in cluster.replicas.items() if rid != owner_id)
    keys = _mind_keys(conv.name)
    r = cluster.redis.client()
    wait_until(lambda: r.exists(keys.manifest) == 1, 30, "the mind's publication")
    dropped = httpx.post(f"{other.url}/minds/{conv.name}?action=drop", timeout=60)
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["tier"] == "none" and dropped.headers["x-kvswap-replica"] == owner_id
    assert [r.exists(k) for k in (keys.manifest, keys.tokens, keys.lease)] == [0, 0, 0]
    assert workload.chat_turn(c, conv, 3).cache_n == 0  # nothing left anywhere to resume


def test_a_minds_history_read_on_another_replica_comes_from_its_owner(
    cluster: Cluster, baseline: Results
) -> None:
    """Audit A5, for the web page's opening of a mind (GET /minds/NAME): a replica that does
    not own the mind answered from its own copy, or 404; the read goes to the owner, and no
    lease moves."""
    conv = Conversation(12, "history-12")
    c = workload.ChatClient(cluster.url)
    owner_id = workload.chat_turn(c, conv, 1).replica
    workload.chat_turn(c, conv, 2)
    other = next(r for rid, r in cluster.replicas.items() if rid != owner_id)
    read = httpx.get(f"{other.url}/minds/{conv.name}", timeout=60)
    assert read.status_code == 200, read.text
    assert read.headers["x-kvswap-replica"] == owner_id and read.json()["n_tokens"] > 0
    holder = cluster.redis.client().get(_mind_keys(conv.name).lease) or b""
    assert holder.split(b" ")[0].decode() == owner_id  # the lease stayed where it was
