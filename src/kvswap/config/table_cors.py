"""Flag table: what a browser on another origin meets, as the pinned llama-server sets it up.

Owns the `--cors-*` flags, `--ui-mcp-proxy` (the web UI's CORS proxy, `/cors-proxy`) with
kvswap's bounds on it (`--ui-mcp-proxy-allow`: the non-public networks it may reach;
`--ui-mcp-proxy-max-bytes`: the largest body either way), and the agent flags whose only effect in kvswap is llama-server's security default: `--tools`,
`--mcp-servers-config`, `--mcp-servers-json` and `-ag/--agent` limit `--cors-origins` to
`localhost` unless it is given (settled in `flags._finish`). kvswap runs no built-in tools and
no MCP servers; `kvswap serve` warns when they are asked for.
"""

from __future__ import annotations

import ipaddress

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag, set_bool, set_str
from kvswap.config.sizes import parse_size
from kvswap.config.values import split_csv

VALUE, TOGGLE = Kind.VALUE, Kind.TOGGLE
SERVER, LIMITS = Group.SERVER, Group.LIMITS

# Flags that, when given and --cors-origins is not, limit CORS to localhost (arg.cpp).
LOCALHOST_DEFAULT_ORIGINS = "localhost"


def _set_tools(b: Builder, v: str) -> None:
    b.update("http", server_tools=tuple(split_csv(v)))


def _set_mcp(b: Builder, v: str) -> None:
    b.update("http", mcp_servers=bool(v))


def _set_agent(b: Builder, v: str) -> None:
    on = v == "1"
    b.update("http", server_tools=("all",) if on else (), ui_mcp_proxy=on)


def _set_proxy_allow(b: Builder, v: str) -> None:
    nets = []
    for word in (w.strip() for w in split_csv(v)):
        try:
            nets.append(str(ipaddress.ip_network(word, strict=False)))
        except ValueError as err:
            raise ValueError(
                f"{word!r}: expected addresses or networks such as 127.0.0.1 or 10.0.0.0/8"
            ) from err
    b.update("http", ui_mcp_proxy_allow=tuple(nets))


def _set_proxy_max_bytes(b: Builder, v: str) -> None:
    n_bytes = parse_size(v, "--ui-mcp-proxy-max-bytes")
    if n_bytes < 1:
        raise ValueError("must be at least 1 byte")
    b.update("http", ui_mcp_proxy_max_bytes=n_bytes)


def cors_origins_default(b: Builder) -> None:
    """llama-server: tools or MCP servers without an explicit --cors-origins mean localhost."""
    if (b.http.server_tools or b.http.mcp_servers) and "--cors-origins" not in b.given:
        b.update("http", cors_origins=LOCALHOST_DEFAULT_ORIGINS)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--cors-origins", VALUE, SERVER, set_str("http", "cors_origins"),
         env="LLAMA_ARG_CORS_ORIGINS", hint="ORIGINS",
         help="comma-separated list of allowed origins for CORS (default: *); the special "
         "value 'localhost' reflects the Origin header only if it is localhost"),
    flag("--cors-methods", VALUE, SERVER, set_str("http", "cors_methods"),
         env="LLAMA_ARG_CORS_METHODS", hint="METHODS",
         help="comma-separated list of allowed methods for CORS (default: GET, POST, DELETE, "
         "OPTIONS)"),
    flag("--cors-headers", VALUE, SERVER, set_str("http", "cors_headers"),
         env="LLAMA_ARG_CORS_HEADERS", hint="HEADERS",
         help="comma-separated list of allowed headers for CORS (default: *)"),
    flag("--cors-credentials", TOGGLE, SERVER, set_bool("http", "cors_credentials"),
         neg="--no-cors-credentials", env="LLAMA_ARG_CORS_CREDENTIALS",
         help="whether to allow credentials for CORS (default: enabled); enabled with "
         "--cors-origins * echoes the Origin header back"),
    flag("--ui-mcp-proxy --webui-mcp-proxy", TOGGLE, SERVER, set_bool("http", "ui_mcp_proxy"),
         neg="--no-ui-mcp-proxy --no-webui-mcp-proxy", env="LLAMA_ARG_UI_MCP_PROXY",
         help="experimental: serve the CORS proxy /cors-proxy?url=... (default: disabled); "
         "do not enable in untrusted environments"),
    flag("--ui-mcp-proxy-allow", VALUE, LIMITS, _set_proxy_allow,
         env="KVSWAP_ARG_UI_MCP_PROXY_ALLOW", hint="NETS",
         help="comma-separated addresses or networks (127.0.0.1, 10.0.0.0/8) /cors-proxy may "
         "reach although not public; every other loopback, link-local (cloud metadata) or "
         "private target is refused (default: none)"),
    flag("--ui-mcp-proxy-max-bytes", VALUE, LIMITS, _set_proxy_max_bytes,
         env="KVSWAP_ARG_UI_MCP_PROXY_MAX_BYTES", hint="SIZE",
         help="the largest body /cors-proxy sends to its target or relays back (default: 32M)"),
    flag("--tools", VALUE, SERVER, _set_tools, env="LLAMA_ARG_TOOLS", hint="TOOL1,TOOL2,...",
         help="llama-server's built-in agent tools: kvswap runs none; given, CORS defaults "
         "to localhost, as llama-server"),
    flag("--mcp-servers-config", VALUE, SERVER, _set_mcp, env="LLAMA_ARG_MCP_SERVERS_CONFIG",
         hint="PATH", help="llama-server's MCP servers: kvswap runs none; given, CORS "
         "defaults to localhost, as llama-server"),
    flag("--mcp-servers-json", VALUE, SERVER, _set_mcp, env="LLAMA_ARG_MCP_SERVERS_JSON",
         hint="JSON", help="as --mcp-servers-config, inline"),
    flag("-ag --agent", TOGGLE, SERVER, _set_agent, neg="-no-ag --no-agent",
         env="LLAMA_ARG_AGENT",
         help="the CORS proxy and every built-in tool (kvswap: the proxy; no tools)"),
)
# fmt: on
