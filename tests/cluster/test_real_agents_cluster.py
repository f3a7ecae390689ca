"""Claude Code and Codex sessions through HAProxy to two replicas (`kvswap cluster up` on
SmolLM2, YaRN to 16k tokens), driven as in tests/server/test_real_agents.py: every request of a
session lands on one replica, the one holding its mind, and the second turn reads the mind the
first turn left there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvswap.agents.drive import CONTEXT_16K
from kvswap.agents.recorder import Exchange
from kvswap.models import default_model_path
from tests.cluster.upcluster import ClusterUp
from tests.server.real_agents import (
    Count,
    Session,
    anthropic_count,
    claude_session,
    codex_session,
    responses_count,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterUp]:
    state = tmp_path_factory.mktemp("agents-cluster") / "state"
    up = ClusterUp(state, 2, CONTEXT_16K, model=default_model_path())
    try:
        up.start()
        yield up
    finally:
        up.close()


def replica_of(x: Exchange) -> str:
    headers = {k.lower(): v for k, v in x.answer_headers.items()}
    return headers.get("x-kvswap-replica", "")


def assert_on_the_minds_replica(run: Session, count: Callable[[Exchange], Count]) -> None:
    replicas = [replica_of(x) for x in run.all]
    assert len(set(replicas)) == 1 and replicas[0], replicas
    last, resumed = count(run.turn1[-1]), count(run.turn2[0])
    assert resumed.prompt - resumed.prefilled >= last.prompt, (last, resumed)


@pytest.mark.timeout(1500)
def test_claude_code_and_codex_sessions_stay_on_their_minds_replica(
    cluster: ClusterUp, tmp_path: Path
) -> None:
    """Defect caught: Codex's bodies (40 KB and more) hide its `prompt_cache_key` from
    HAProxy's 16 KiB buffer, so its requests were balanced round robin and each turn hopped to
    the mind's owner."""
    claude = claude_session(cluster.url, tmp_path / "claude", "none")
    assert_on_the_minds_replica(claude, anthropic_count)
    codex = codex_session(cluster.url, tmp_path / "codex", "none")
    assert_on_the_minds_replica(codex, responses_count)
