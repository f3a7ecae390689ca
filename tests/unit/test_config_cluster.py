"""The cluster's serve flags: what each sets, the defaults of the research note, and typed
errors that name the flag at fault (a flag that needs the shared tier, a shared tier that needs
a replica id, an advertised URL and the page store, malformed values)."""

from __future__ import annotations

import pytest

from kvswap.config import ConfigError, MachineInfo, ServerConfig, parse_serve_args

HOST = MachineInfo(physical_ram_bytes=16 << 30, n_cpu_physical=4, n_cpu_logical=8)
TIER = ["--shared-tier", "redis://10.0.0.9:6379/2", "--replica-id", "r2",
        "--advertise-url", "http://10.0.0.2:8080/",
        "--shared-tier-peers", "http://10.0.0.1:8080,http://10.0.0.2:8080"]  # fmt: skip


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServerConfig:
    return parse_serve_args(argv, env or {}, machine=HOST)


def fails(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        parse(argv)
    return str(err.value)


def test_a_replica_of_a_cluster() -> None:
    c = parse(TIER).cluster
    assert (c.shared_tier, c.replica_id, c.advertise_url) == (
        "redis://10.0.0.9:6379/2",
        "r2",
        "http://10.0.0.2:8080",
    )
    assert (c.rpo_tokens, c.rpo_seconds, c.lease_ms, c.shared_tier_bytes) == (
        2048,
        30.0,
        5000,
        None,
    )
    assert (c.quiet_seconds, c.release_seconds, c.drain_seconds) == (2.0, 60.0, 60.0)
    assert c.peers == ("http://10.0.0.1:8080", "http://10.0.0.2:8080")
    c = parse([*TIER, "--shared-tier-rpo-tokens", "0", "--shared-tier-rpo-seconds", "2.5",
               "--shared-tier-lease-ms", "1500", "--shared-tier-bytes", "64G"]).cluster  # fmt: skip
    assert (c.rpo_tokens, c.rpo_seconds, c.lease_ms, c.shared_tier_bytes) == (
        0,
        2.5,
        1500,
        64 << 30,
    )


def test_the_environment_names_a_replica() -> None:
    env = {
        "KVSWAP_ARG_SHARED_TIER": "redis://redis:6379/0",
        "KVSWAP_ARG_REPLICA_ID": "kvswap-1",
        "KVSWAP_ARG_ADVERTISE_URL": "http://kvswap-1:8080",
        "KVSWAP_ARG_SHARED_TIER_PEERS": "http://kvswap-1:8080,http://kvswap-2:8080",
    }
    c = parse([], env).cluster
    assert (c.shared_tier, c.replica_id, c.advertise_url) == (
        "redis://redis:6379/0",
        "kvswap-1",
        "http://kvswap-1:8080",
    )


def test_no_cluster_by_default() -> None:
    assert parse([]).cluster.shared_tier is None


@pytest.mark.parametrize(
    "flag, value",
    [("--replica-id", "r1"), ("--advertise-url", "http://h:1"), ("--shared-tier-bytes", "1G"),
     ("--shared-tier-rpo-tokens", "5"), ("--shared-tier-rpo-seconds", "5"),
     ("--shared-tier-lease-ms", "500"), ("--shared-tier-peers", "http://h:1")],
)  # fmt: skip
def test_cluster_flags_need_the_shared_tier(flag: str, value: str) -> None:
    assert fails([flag, value]) == f"{flag} needs --shared-tier (the cluster's Redis)"


def test_a_shared_tier_needs_a_name_an_address_and_the_page_store() -> None:
    assert "--shared-tier needs --replica-id" in fails(TIER[:2])
    assert "--shared-tier needs --advertise-url" in fails(TIER[:4])
    assert "--shared-tier needs --shared-tier-peers" in fails(TIER[:6])
    assert "does not list this replica's --advertise-url" in fails(
        [*TIER[:6], "--shared-tier-peers", "http://10.0.0.1:8080"]
    )
    assert "--page-ram-bytes" in fails([*TIER, "--page-ram-bytes", "0"])


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--shared-tier", "http://10.0.0.9:6379"], "--shared-tier"),
        (["--replica-id", "r 1"], "--replica-id"),
        (["--replica-id", "x" * 65], "--replica-id"),
        (["--advertise-url", "10.0.0.2:8080"], "--advertise-url"),
        (["--advertise-url", "http://10.0.0.2"], "--advertise-url"),
        (["--advertise-url", "http://10.0.0.2:8080/v1"], "--advertise-url"),
        (["--shared-tier-rpo-tokens", "-1"], "--shared-tier-rpo-tokens"),
        (["--shared-tier-rpo-seconds", "0"], "--shared-tier-rpo-seconds"),
        (["--shared-tier-lease-ms", "50"], "--shared-tier-lease-ms"),
        (["--shared-tier-bytes", "0"], "--shared-tier-bytes"),
        (["--shared-tier-peers", "http://a:1,b:2"], "--shared-tier-peers"),
        (["--shared-tier-quiet-seconds", "0"], "--shared-tier-quiet-seconds"),
    ],
)
def test_a_bad_value_names_its_flag(argv: list[str], flag: str) -> None:
    assert f'"{flag}"' in fails([*TIER, *argv])
