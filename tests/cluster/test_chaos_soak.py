"""The chaos soak: `kvswap cluster up --replicas 3` (real redis-server, HAProxy and replica
processes on a tiny model, the default RPO settings) while 30 minds chat through HAProxy with
the OpenAI client, and every 20 s a random fault strikes: SIGKILL of a replica, SIGSTOP of a
replica past its lease (then SIGCONT), or SIGKILL of Redis (`cluster up` restarts what died;
Redis comes back from its append-only file).

Checks: no turn fails once the client's retries (backing off, honouring Retry-After) are
spent; every answer's tokens equal the fault-free run's of its conversation, but for a
divergence at a near tie (`workload.agree`: a mind prefilled again computes in a prompt batch
the KV its decode steps had computed, and floats differ by ~0.01); the tokens a fault
made a turn prefill again stay within the RPO bound (`--shared-tier-rpo-tokens`, 2048 by
default); and the soak reports them (docs/RELIABILITY.md). CI runs `KVSWAP_CHAOS_S` = 90
seconds; the long soak is `KVSWAP_CHAOS_S=600 pytest -s tests/cluster/test_chaos_soak.py`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cluster import workload
from tests.cluster.chaos import Chaos, Chatters, Report
from tests.cluster.upcluster import ClusterUp
from tests.cluster.workload import Conversation

DURATION_S = float(os.environ.get("KVSWAP_CHAOS_S", "90"))
N_MINDS, EVERY_S, STOP_S = 30, 20.0, 3.0
PACE_S = 3.0  # a turn of each mind every 3 s: about 10 turns a second over the cluster
N_TURNS = 12  # turns of one conversation (then the mind index starts another)
RPO_TOKENS = 2048  # the default --shared-tier-rpo-tokens
SERVE = ["-c", "2048", "-np", "1", "--cache-ram", "0", "--shared-tier-lease-ms", "1500"]
pytestmark = [pytest.mark.model, pytest.mark.timeout(int(600 + 3 * DURATION_S))]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUp]:
    cluster = ClusterUp(tmp_path_factory.mktemp("chaos") / "cluster", 3, SERVE)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        print(cluster.output())
        raise
    finally:
        cluster.close()


def test_chaos_soak(up: ClusterUp) -> None:
    baseline = workload.run(
        up.url, [Conversation(i, f"calm-{i}") for i in range(N_MINDS)], range(1, N_TURNS + 1)
    )
    t0 = time.monotonic()
    chatters = Chatters(
        up.url, N_MINDS, N_TURNS, PACE_S, max_retries=8, until=t0 + DURATION_S
    )  # fmt: skip
    chaos = Chaos(up, seed=27, every_s=EVERY_S, stop_s=STOP_S)
    stop = threading.Event()
    striker = threading.Thread(target=chaos.run, args=(t0, t0 + DURATION_S, stop))
    striker.start()
    try:
        chatters.run()
    finally:
        stop.set()
        striker.join(60)
    report = Report.of(chatters, baseline, chaos.strikes)
    print(f"chaos soak {DURATION_S:.0f} s: {report}")
    assert report.strikes, "no fault struck"
    assert report.n_failed == 0, chatters.failed
    assert report.n_turns >= N_MINDS * min(N_TURNS, DURATION_S / PACE_S) / 2
    assert not report.differs, report.differs
    assert report.max_reprefilled_tokens <= RPO_TOKENS
