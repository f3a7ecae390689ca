"""`kvswap cluster up`'s plan (`cluster.up.make_plan`, `replica_argv`, `replica_env`): the flags
the cluster sets are refused from the user in either spelling, without echoing a value; the
shared tier's own flags are accepted; the Redis URL with its password reaches a replica only
through its environment; the tier's budget defaults to 3/4 of Redis's maxmemory unless given;
and the port check tolerates sockets in TIME-WAIT but not a listener."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvswap.cluster.procs import free_block, free_port, port_is_free
from kvswap.cluster.up import ClusterUpError, make_plan, replica_argv, replica_env


def _base(n_ports: int = 3) -> int:
    return free_block(n_ports)


@pytest.mark.parametrize(
    "flag", ["--port", "--host", "--slot-save-path", "--shared-tier", "--replica-id"]
)
def test_flags_the_cluster_sets_are_refused_without_their_value(tmp_path: Path, flag: str) -> None:
    for words in ([flag, "redis://:hunter2@h/0"], [f"{flag}=redis://:hunter2@h/0"]):
        with pytest.raises(ClusterUpError) as refused:
            make_plan(1, _base(), tmp_path, words, free_port())
        assert flag in str(refused.value) and "hunter2" not in str(refused.value)


def test_the_url_goes_through_the_environment_and_the_budget_follows_maxmemory(
    tmp_path: Path,
) -> None:
    plan = make_plan(
        2, _base(), tmp_path, ["--shared-tier-rpo-seconds", "1"], free_port(),
        redis_maxmemory_bytes=256 << 20,
    )  # fmt: skip
    argv = replica_argv(plan, plan.replicas[0])
    assert plan.redis_password not in " ".join(argv) and "--shared-tier" not in argv
    assert argv[argv.index("--shared-tier-bytes") + 1] == str(192 << 20)
    env = replica_env(plan)
    assert env["KVSWAP_ARG_SHARED_TIER"] == plan.redis_url
    assert f":{plan.redis_password}@" in plan.redis_url
    assert plan.redis_url_shown == f"redis://:***@127.0.0.1:{plan.redis_port}/0"
    assert env["KVSWAP_CLUSTER_STATE"] == str(plan.state_dir / "cluster.json")
    assert plan.redis_password != make_plan(1, _base(), tmp_path, [], free_port()).redis_password
    given = make_plan(1, _base(), tmp_path, ["--shared-tier-bytes", "1G"], free_port())
    argv = replica_argv(given, given.replicas[0])
    assert argv.count("--shared-tier-bytes") == 1 and "1G" in argv  # the user's, alone


def test_a_small_maxmemory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterUpError, match="--redis-maxmemory"):
        make_plan(1, _base(), tmp_path, [], free_port(), redis_maxmemory_bytes=1 << 20)


def test_the_port_check_tolerates_time_wait_but_not_a_listener() -> None:
    listener = socket.socket()  # a server's listener, which sets SO_REUSEADDR as they all do
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    assert not port_is_free(port)  # listening
    listener.close()
    accepted.close()  # the server side closes first: its socket stays in TIME-WAIT
    client.close()
    assert port_is_free(port)
