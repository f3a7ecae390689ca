"""`kvswap cluster up`: redis-server, HAProxy and two real `kvswap serve` replicas on a tiny
model come up healthy, each joined to the shared tier (`--replica-id`, `--advertise-url`, and
the Redis URL with its generated password in the environment, never in any process's argv:
/props and the logs show it as `***`); Redis requires that password and has a `maxmemory`, the
replicas' tier budget is 3/4 of it; a chat turn through HAProxy (the OpenAI client sending
X-Mind-Id) names its replica, and the mind's next turn lands on the same replica and reuses its
cache; SIGTERM stops every process, and cluster.json then says so, with no pid left in it."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import redis

from kvswap.cluster.haproxy import REPLICA_HEADER
from tests.cluster.upcluster import ClusterUp, gone

pytestmark = pytest.mark.timeout(300)


def _password(state_dir: Path) -> str:
    conf = state_dir / "redis" / "redis.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    (line,) = [ln for ln in conf.read_text().splitlines() if ln.startswith("requirepass ")]
    return line.split()[1]


def test_cluster_up_serves_through_haproxy_and_stops_on_sigterm(tmp_path: Path) -> None:
    up = ClusterUp(tmp_path / "cluster", 2, ["-c", "512", "-np", "1", "--redis-maxmemory", "256M"])
    try:
        info = up.start()
        password = _password(up.state_dir)
        assert password not in (up.state_dir / "cluster.json").read_text()
        url = f"redis://:{password}@127.0.0.1:{up.redis_port}/0"
        assert info["redis"]["url"] == f"redis://:***@127.0.0.1:{up.redis_port}/0"
        tier = redis.Redis(host="127.0.0.1", port=up.redis_port, password=password)
        assert tier.config_get("maxmemory") == {"maxmemory": str(256 << 20)}
        assert tier.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=up.redis_port).ping()
        for child in (info["haproxy"], info["redis"], *info["replicas"]):
            assert password not in " ".join(psutil.Process(child["pid"]).cmdline())
        for r in info["replicas"]:
            process = psutil.Process(r["pid"])
            cmdline = process.cmdline()
            assert process.environ()["KVSWAP_ARG_SHARED_TIER"] == url
            assert cmdline[cmdline.index("--slot-save-path") + 1] == r["slots"]
            assert cmdline[cmdline.index("--replica-id") + 1] == r["id"]
            assert cmdline[cmdline.index("--advertise-url") + 1] == r["url"]
            assert cmdline[cmdline.index("--shared-tier-bytes") + 1] == str((256 << 20) * 3 // 4)
            cluster = httpx.get(f"{r['url']}/props", timeout=30).json()["cluster"]
            assert (cluster["replica_id"], cluster["advertise_url"]) == (r["id"], r["url"])
            assert cluster["shared_tier"] == info["redis"]["url"]  # the password hidden

        client = openai.OpenAI(
            base_url=f"{up.url}/v1", api_key="unused", default_headers={"X-Mind-Id": "alice"}
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

        assert up.stop() == 0, up.output()
        assert "cluster: stopped" in up.output()
        assert all(gone(pid) for pid in up.pids), [p for p in up.pids if not gone(p)]
        after = up.state()
        assert after["running"] is False
        children = [after["haproxy"], after["redis"], *after["replicas"]]
        assert all(c["pid"] is None and c["state"] == "stopped" for c in children), children
        assert up.status()["running"] is False
        logs = [p.read_text() for p in (up.state_dir / "logs").iterdir()] + [up.output()]
        assert not [text for text in logs if password in text]
        assert (up.state_dir / ".gitignore").read_text().splitlines()[-1] == "*"
    finally:
        up.close()
