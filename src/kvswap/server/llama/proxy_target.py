"""Where /cors-proxy may send a request: the target URL's checks, its host's resolution, and the
address policy (audit B3: an open proxy reached loopback, the pod network, other replicas'
internal routes and the cloud metadata service).

- `parse_target`: http or https, a host, no credentials in the URL (a typed 400 otherwise, as
  llama-server's checks, which it answers with a 500).
- `TargetPolicy.check`: an address is allowed when it is globally routable (Python's
  `ipaddress.is_global`: not loopback, link-local with 169.254.169.254, private, CGNAT,
  unspecified, reserved or documentation ranges; an IPv4-mapped IPv6 address is judged as its
  IPv4 address) or inside a network of `--ui-mcp-proxy-allow`. Multicast is never allowed.
- `resolve`: the host's every address (getaddrinfo, off the event loop) must be allowed, else
  the request is refused (403, naming the address and the flag; a host that does not resolve is
  an `UpstreamError`, a 502); the first one is returned, and
  the request is sent to that address (pinned: a second lookup, which DNS rebinding would
  answer differently, never happens). Redirects go through the same checks.

Pure apart from `resolve` (a DNS lookup).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from kvswap.core.errors import ErrorKind, KvswapError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]
ALLOW_FLAG = "--ui-mcp-proxy-allow"


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written in the URL (brackets of an IPv6 literal removed)
    port: int
    path: str  # path with its query

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port


def parse_target(url: str) -> Target:
    """The parts of a proxy target URL, or a typed 400."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, f"unsupported URL scheme in target URL: {parts.scheme!r}"
        )
    if not parts.hostname:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "invalid target URL: missing host")
    if parts.password is not None or parts.username is not None:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "authentication in target URL is not supported"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        raise KvswapError(ErrorKind.INVALID_REQUEST, f"invalid target URL: {err}") from err
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, parts.hostname, port, path)


class UpstreamError(Exception):
    """The target could not be resolved, reached or read: the route answers 502."""


class TargetPolicy:
    """The addresses /cors-proxy may reach (see the module docstring)."""

    def __init__(self, allow: Sequence[str] = ()) -> None:
        self.allow: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(n) for n in allow)

    def refusal(self, address: str) -> str | None:
        """Why `address` may not be reached, or None when it may."""
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])  # no IPv6 zone
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_multicast:
            return f"{ip} is a multicast address"
        if ip.is_global or any(ip in net for net in self.allow if net.version == ip.version):
            return None
        kind = next(
            (name for name, hit in (
                ("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                ("link-local", ip.is_link_local), ("private", ip.is_private),
            ) if hit),
            "not public",
        )  # fmt: skip
        return f"{ip} is a {kind} address (allow it with {ALLOW_FLAG})"

    async def resolve(self, target: Target, resolver: Resolver | None = None) -> str:
        """The address to send to: every address of the host allowed, else a typed 403."""
        addresses = await (resolver or getaddrinfo)(target.host, target.port)
        if not addresses:
            raise UpstreamError(f"the proxy target {target.host} has no address")
        for address in addresses:
            why = self.refusal(address)
            if why is not None:
                raise KvswapError(
                    ErrorKind.PERMISSION, f"the proxy target {target.host} is refused: {why}"
                )
        return addresses[0]


async def getaddrinfo(host: str, port: int) -> list[str]:
    """Every address of `host`, in the resolver's order (deduplicated); an address literal is
    its own answer (no lookup, no executor thread)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass  # a name
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise UpstreamError(f"the proxy target {host} could not be resolved: {err}") from err
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
