"""The HAProxy 2.6 configuration of a kvswap cluster, and its runtime API (docs/CLUSTER.md, "The HAProxy config").

Routing: a request's route key is `<Authorization><x-api-key>|<mind>`, the mind taken from the
`X-Mind-Id` header, else from the JSON body's `mind` when the body fits HAProxy's buffer
(`tune.bufsize`, 16 KiB: longer bodies must send the header), else from a session key in
kvswap's order (the body's `prompt_cache_key`, the same bound, else Codex's `session-id` header,
which carries the same id on bodies of 40 KB and more; `X-Conversation-Id`;
`x-claude-code-session-id`), so
a client that names no mind reaches the replica that holds its session's mind. `balance hash` on that key with `hash-type
consistent` keeps a mind on one replica and moves only a lost replica's minds; hashing the API
key with the mind spreads tenants that all name a mind `default`. A request naming no mind has
no route key and is balanced round robin. Every server has a fixed HAProxy `id` derived from
its replica id (not from its position in the list), so reordering the list, or running several
HAProxies on the same list, gives the same ring. Health: `GET /health` (kvswap answers 503
while loading). Retries only when the connection failed (a request that reached a replica is
never replayed); each request gets its own server connection (`http-server-close`), so one
sent right after a replica died is redispatched rather than lost on a connection the dead
replica left behind. Generation streams get 15-minute timeouts. Each answer carries
`X-Kvswap-Replica: <replica id>`: the replica's own header when it sets one (kvswap does, naming
the owner of a forwarded turn), else the server's name. The runtime API socket (admin level) drains a replica:
`set server replicas/<id> state drain`.

`--dns` mode (compose, Kubernetes) names replicas by host name, resolved at run time from
/etc/resolv.conf, and starts even while they do not resolve yet.

Owns the config text and the runtime API client. Pure apart from `runtime()` (a Unix socket).
"""

from __future__ import annotations

import re
import socket
import zlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

BACKEND: Final = "replicas"
REPLICA_HEADER: Final = "X-Kvswap-Replica"
MIND_HEADER: Final = "X-Mind-Id"
_MAX_SERVER_ID: Final = (1 << 20) - 1  # HAProxy hashes puid * 4096 + node in 32 bits
_REPLICA_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]{1,253}|\[[0-9A-Fa-f:.]+\]")


class HaproxyConfigError(ValueError):
    """A replica or option the config cannot be made from (the message names it)."""


@dataclass(frozen=True)
class Replica:
    replica_id: str
    host: str
    port: int

    @property
    def server_id(self) -> int:
        """HAProxy's persistent server id: a function of the replica id alone."""
        return zlib.crc32(self.replica_id.encode()) % _MAX_SERVER_ID + 1

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_replica(text: str) -> Replica:
    """`ID=URL` with URL `http://host:port` (or `host:port`)."""
    replica_id, sep, url = text.partition("=")
    if not sep or not _REPLICA_ID_RE.fullmatch(replica_id):
        raise HaproxyConfigError(
            f"--replica {text!r}: expected ID=URL, ID of 1-64 of A-Z a-z 0-9 _ . -"
        )
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or parts.path not in ("", "/") or parts.query:
        raise HaproxyConfigError(f"--replica {text!r}: URL must be http://host:port")
    try:
        port = parts.port
    except ValueError as err:
        raise HaproxyConfigError(f"--replica {text!r}: {err}") from err
    host = parts.hostname or ""
    if port is None or not _HOST_RE.fullmatch(host):
        raise HaproxyConfigError(f"--replica {text!r}: URL must name a host and a port")
    if ":" in host:
        host = f"[{host}]"
    return Replica(replica_id, host, port)


@dataclass(frozen=True)
class HaproxyConfig:
    replicas: tuple[Replica, ...]
    bind: str = "127.0.0.1"
    port: int = 8080
    socket_path: str = "/run/haproxy/kvswap.sock"
    check_inter_ms: int = 1000
    dns: bool = False
    stream_timeout_s: int = 900

    def __post_init__(self) -> None:
        if not self.replicas:
            raise HaproxyConfigError("--replica: at least one replica is needed")
        ids = [r.replica_id for r in self.replicas]
        if len(set(ids)) != len(ids):
            raise HaproxyConfigError(f"--replica: replica ids repeat ({', '.join(ids)})")
        server_ids = {r.server_id: r.replica_id for r in self.replicas}
        if len(server_ids) != len(ids):
            raise HaproxyConfigError("--replica: two replica ids hash to one server id; rename one")
        if not 0 < self.port < 65536:
            raise HaproxyConfigError(f"--port {self.port}: not a TCP port")
        if self.check_inter_ms < 100:
            raise HaproxyConfigError(f"--check-inter-ms {self.check_inter_ms}: at least 100")
        if any(c.isspace() for c in self.socket_path + self.bind):
            raise HaproxyConfigError("--socket and --bind take no spaces")


_RESOLVERS = """
resolvers dns
    parse-resolv-conf
    hold valid 10s
    resolve_retries 3
    timeout resolve 1s
    timeout retry 1s
"""


def render(cfg: HaproxyConfig) -> str:
    """The haproxy.cfg text."""
    dns = " resolvers dns init-addr last,libc,none resolve-prefer ipv4" if cfg.dns else ""
    servers = "\n".join(
        f"    server {r.replica_id} {r.address} id {r.server_id}" for r in cfg.replicas
    )
    resolvers = _RESOLVERS if cfg.dns else ""
    return f"""# kvswap cluster: generated by `kvswap cluster haproxy-config` for HAProxy 2.6.
# Regenerate rather than edit: every HAProxy of a cluster must hold the same replica ids.
global
    log stdout format raw local0 info
    stats socket {cfg.socket_path} mode 600 level admin
    stats timeout 30s

defaults
    mode http
    log global
    option httplog
    option forwardfor
    timeout connect 2s
    timeout http-request 60s
    timeout client {cfg.stream_timeout_s}s
    timeout server {cfg.stream_timeout_s}s
    timeout check 2s
    # retry (on another replica) only when no connection was made: a turn is never replayed
    retries 2
    option redispatch 1
    retry-on conn-failure
    # a fresh server connection per request (clients keep theirs): a request right after a
    # replica died fails to connect and is redispatched, instead of being sent on a kept
    # connection the dead replica left behind (the client would get no answer at all)
    option http-server-close
{resolvers}
frontend kvswap
    bind {cfg.bind}:{cfg.port}
    option http-buffer-request
    # replica-to-replica only: a client never sends a hop mark nor asks for a hand-off
    http-request del-header x-kvswap-hop
    http-request deny deny_status 404 if {{ path_beg /cluster/ }}
    http-request set-var(txn.mind) req.hdr({MIND_HEADER.lower()})
    http-request set-var(txn.mind) path,field(3,/),url_dec if {{ path_beg /minds/ }} !{{ var(txn.mind) -m found }}
    http-request set-var(txn.mind) req.body,json_query('$.mind') if METH_POST !{{ var(txn.mind) -m found }}
    http-request set-var(txn.mind) req.body,json_query('$.prompt_cache_key') if METH_POST !{{ var(txn.mind) -m found }}
    http-request set-var(txn.mind) req.hdr(session-id) if !{{ var(txn.mind) -m found }}
    http-request set-var(txn.mind) req.hdr(x-conversation-id) if !{{ var(txn.mind) -m found }}
    http-request set-var(txn.mind) req.hdr(x-claude-code-session-id) if !{{ var(txn.mind) -m found }}
    http-request set-var-fmt(txn.route) "%[req.hdr(authorization)]%[req.hdr(x-api-key)]|%[var(txn.mind)]" if {{ var(txn.mind) -m found }}
    default_backend {BACKEND}

backend {BACKEND}
    # key|mind -> one replica; no mind -> no key -> round robin
    balance hash var(txn.route)
    hash-type consistent sdbm avalanche
    option httpchk GET /health
    http-check expect status 200
    # a replica names itself (the owner, on a turn it was forwarded); else its server name
    http-response set-header {REPLICA_HEADER} %[srv_name] unless {{ res.hdr({REPLICA_HEADER.lower()}) -m found }}
    default-server check inter {cfg.check_inter_ms}ms fall 2 rise 2 weight 100 on-marked-down shutdown-sessions{dns}
{servers}
"""


def runtime(socket_path: str, command: str, timeout_s: float = 5.0) -> str:
    """Send one command to HAProxy's runtime API and return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(socket_path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def server_status(socket_path: str) -> dict[str, str]:
    """Each replica's state as HAProxy sees it (`UP`, `DOWN`, `DRAIN`, `MAINT`, ...)."""
    lines = runtime(socket_path, "show stat").splitlines()
    if not lines or not lines[0].startswith("# "):
        raise RuntimeError(f"unexpected 'show stat' answer: {lines[:1]}")
    header = lines[0][2:].split(",")
    px, sv, status = header.index("pxname"), header.index("svname"), header.index("status")
    states = {}
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) > status and fields[px] == BACKEND and fields[sv] != "BACKEND":
            states[fields[sv]] = fields[status]
    return states


def set_state(socket_path: str, replica_id: str, state: str) -> None:
    """`ready`, `drain` or `maint` a replica; raises RuntimeError on a refusal."""
    answer = runtime(socket_path, f"set server {BACKEND}/{replica_id} state {state}").strip()
    if answer:
        raise RuntimeError(f"haproxy refused 'set server {replica_id} state {state}': {answer}")
