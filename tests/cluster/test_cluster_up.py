"""`kvswap cluster up`: redis-server, HAProxy and two real `kvswap serve` replicas on a tiny
model come up healthy, each joined to the shared tier (`--shared-tier`, `--replica-id`,
`--advertise-url`: /props says so); a chat turn through HAProxy (the OpenAI client sending
X-Mind-Id) names its replica, and the mind's next turn lands on the same replica and reuses its
cache; SIGTERM stops every process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from kvswap.cluster.haproxy import REPLICA_HEADER
from kvswap.cluster.procs import free_port
from kvswap.tiny import tiny_model_path
from tests.cluster.util import wait_until

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cluster_up_serves_through_haproxy_and_stops_on_sigterm(tmp_path: Path) -> None:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    port = free_port()
    state = tmp_path / "cluster"
    out = tmp_path / "up.log"
    argv = [
        sys.executable, "-m", "kvswap", "cluster", "up", "--replicas", "2", "--port", str(port),
        "--redis-port", str(free_port()), "--dir", str(state), "--check-inter-ms", "200",
        "-m", str(model), "-c", "512", "-np", "1", "-t", "1", "-tb", "1",
    ]  # fmt: skip
    with open(out, "wb") as log:
        up = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    pids: list[int] = []
    try:
        wait_until(
            lambda: "kvswap cluster up: ready" in out.read_text() or up.poll() is not None,
            240,
            "the cluster to come up",
        )
        assert up.poll() is None, out.read_text()
        info = json.loads((state / "cluster.json").read_text())
        pids = [info["haproxy"]["pid"], info["redis"]["pid"], *(r["pid"] for r in info["replicas"])]
        for r in info["replicas"]:
            cmdline = psutil.Process(r["pid"]).cmdline()
            assert cmdline[cmdline.index("--slot-save-path") + 1] == r["slots"]
            assert cmdline[cmdline.index("--shared-tier") + 1] == info["redis"]["url"]
            assert cmdline[cmdline.index("--replica-id") + 1] == r["id"]
            assert cmdline[cmdline.index("--advertise-url") + 1] == r["url"]
            cluster = httpx.get(f"{r['url']}/props", timeout=30).json()["cluster"]
            assert (cluster["replica_id"], cluster["advertise_url"]) == (r["id"], r["url"])
            assert cluster["shared_tier"] == info["redis"]["url"]

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key="unused",
            default_headers={"X-Mind-Id": "alice"},
        )
        messages = [{"role": "user", "content": "Tell me about the sea."}]
        first = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=messages,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        replica = first.headers[REPLICA_HEADER]
        assert replica in {r["id"] for r in info["replicas"]}
        answer = first.parse().choices[0].message.content or ""
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "More."}]
        second = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=messages,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        assert second.headers[REPLICA_HEADER] == replica
        usage = second.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens  # the mind's state was on that replica

        up.send_signal(signal.SIGTERM)
        assert up.wait(120) == 0, out.read_text()
        assert "cluster: stopped" in out.read_text()
        assert all(_gone(pid) for pid in pids), [p for p in pids if not _gone(p)]
    finally:
        if up.poll() is None:  # a failed assertion: let the cluster stop its children
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait(30)
        for pid in pids:  # the children live in their own sessions: never leave one behind
            if not _gone(pid):
                psutil.Process(pid).kill()
