"""The token log in a real Redis: write-through appends that a replayed turn applies once,
the request winning over a longer log, and a refused gap."""

from __future__ import annotations

import pytest
import redis

from kvswap.core.keys import mind_key
from kvswap.tiers.shared.errors import TokenLogGap
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Lease, Leases
from kvswap.tiers.shared.token_log import TokenLog
from tests.cluster.util import incarnation

pytestmark = pytest.mark.timeout(60)
MIND = MindKeys.of(mind_key("public", "log"))


def test_token_log_applies_a_replayed_turn_once(rclient: redis.Redis) -> None:
    log = TokenLog(rclient)
    lease = Leases(rclient, incarnation("r1")).acquire(MIND)
    assert isinstance(lease, Lease)
    assert log.append(lease, "turn-1", 0, [10, 11, 12]).n_tokens == 3
    replay = log.append(lease, "turn-1", 0, [10, 11, 12])
    assert not replay.applied and replay.n_tokens == 3
    assert log.append(lease, "turn-2", 3, [13]).applied
    # a full-history request that diverged after token 2: the request wins over the log
    assert log.append(lease, "turn-3", 2, [99, 100]).n_tokens == 4
    assert log.read(MIND).tolist() == [10, 11, 99, 100]
    with pytest.raises(TokenLogGap):
        log.append(lease, "turn-4", 9, [1])
    assert log.read(MIND).tolist() == [10, 11, 99, 100]
    assert log.counters() == {"n_appends": 3, "n_duplicates": 1, "n_stale": 0, "n_gaps": 1}


def test_a_chat_record_goes_with_its_turn_and_goes_with_a_turn_without_one(
    rclient: redis.Redis,
) -> None:
    """The next replica to take a mind reads its last chat turn with the log, and never one
    left by an earlier turn: a turn without a record removes the key."""
    mind = MindKeys.of(mind_key("public", "chat"))
    log = TokenLog(rclient)
    lease = Leases(rclient, incarnation("r1")).acquire(mind)
    assert isinstance(lease, Lease)
    log.append(lease, "turn-1", 0, [1, 2, 3], b"record-1")
    read = log.read_log(mind)
    assert (read.tokens.tolist(), read.turn_id, read.chat) == ([1, 2, 3], "turn-1", b"record-1")
    log.append(lease, "turn-1", 0, [1, 2, 3], b"other")  # a replayed turn changes nothing
    assert log.read_log(mind).chat == b"record-1"
    log.append(lease, "turn-2", 3, [4])  # a raw completion's turn: no chat record
    read = log.read_log(mind)
    assert (read.turn_id, read.chat) == ("turn-2", b"")
    assert rclient.exists(mind.chat) == 0
