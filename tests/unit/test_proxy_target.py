"""/cors-proxy's target policy (`server.llama.proxy_target`), with a stand-in resolver: a host
is reached only when every one of its addresses is allowed, and the request goes to the address
that was checked; the address classes; the allow list per IP version; the URL checks."""

from __future__ import annotations

import asyncio

import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.server.llama.proxy_target import Resolver, TargetPolicy, parse_target


def _resolver(answers: dict[str, list[str]]) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        return answers[host]

    return resolve


def test_every_address_of_a_host_must_be_allowed() -> None:
    policy = TargetPolicy()
    resolver = _resolver({"mixed.example": ["93.184.216.34", "10.0.0.7"],
                          "public.example": ["93.184.216.34", "2606:2800:220:1::1"]})  # fmt: skip
    with pytest.raises(KvswapError) as refused:
        asyncio.run(policy.resolve(parse_target("http://mixed.example/"), resolver))
    assert refused.value.kind is ErrorKind.PERMISSION
    assert "10.0.0.7 is a private address" in refused.value.message
    pinned = asyncio.run(policy.resolve(parse_target("https://public.example/"), resolver))
    assert pinned == "93.184.216.34"  # the checked address is the one used


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.5", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("100.64.0.1", "not public"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ],
)
def test_non_public_addresses_are_refused(address: str, kind: str) -> None:
    why = TargetPolicy().refusal(address)
    assert why is not None and kind in why


def test_public_addresses_and_allowed_networks_pass() -> None:
    assert TargetPolicy().refusal("93.184.216.34") is None
    assert TargetPolicy().refusal("2606:2800:220:1::1") is None
    policy = TargetPolicy(["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"])
    assert policy.refusal("127.0.0.1") is None and policy.refusal("10.200.0.1") is None
    assert policy.refusal("fd12::1") is None
    assert policy.refusal("127.0.0.2") is not None  # outside the allowed network
    assert policy.refusal("::1") is not None
    assert TargetPolicy(["224.0.0.0/4"]).refusal("224.0.0.1") is not None  # never multicast


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "unsupported URL scheme"),
        ("http:///nohost", "missing host"),
        ("http://user:pw@example.com/", "authentication in target URL"),
        ("http://example.com:99999/", "invalid target URL"),
    ],
)
def test_bad_target_urls_are_typed_400s(url: str, message: str) -> None:
    with pytest.raises(KvswapError) as bad:
        parse_target(url)
    assert bad.value.kind is ErrorKind.INVALID_REQUEST and message in bad.value.message


def test_a_target_keeps_its_port_and_query() -> None:
    t = parse_target("https://Example.com/mcp?session=1")
    assert (t.scheme, t.host, t.port, t.path) == ("https", "example.com", 443, "/mcp?session=1")
    assert parse_target("http://[::1]:8080").path == "/"
