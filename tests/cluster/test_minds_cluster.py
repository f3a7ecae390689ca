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
  same text as a cold prefill of the turn.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from kvswap.engine.minds.registry import mind_key, namespace_of
from kvswap.tiers.shared.keys import MindKeys
from tests.cluster import workload
from tests.cluster.replicas import Cluster, check_fence_log
from tests.cluster.util import wait_until
from tests.cluster.workload import Conversation, Results

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
N_MINDS, TURNS = 30, (1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"), 3, ["--shared-tier-rpo-tokens", "0"])
    try:
        c.start()
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


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
