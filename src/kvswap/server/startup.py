"""The start-up mistakes a user makes, caught before anything loads, and the listening sockets.

Owns `check_paths` (the model and draft files readable, `--slot-save-path` writable, each
refused with one line naming the flag and the path) and `bind_listeners` (every `--host`
address bound and listening on `--port`, or one line saying which address failed and why).
`kvswap serve` runs both before uvicorn starts and before the model loads, so a busy port or a
typo in a path costs no model load, prints no traceback, and nothing claims to listen before
its socket is bound. Binding first also serves several `--host` addresses at once (uvicorn
itself binds one), as llama-server: IPv6 listeners are v6-only when there are several TCP
addresses, so `::` does not also claim `0.0.0.0`; a `.sock` host is a UNIX socket.

Also owns `GcpCompat`, what Google Cloud's Vertex AI says in the environment (`AIP_MODE`, its
port and routes; `server.gcp` serves them), read here so that `kvswap serve` learns its port
without importing the HTTP stack before the model starts loading.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from kvswap.config.settings import HttpSettings, ServerConfig

_BACKLOG = 2048  # uvicorn's default
_GGUF_MAGIC = b"GGUF"


class StartupError(Exception):
    """A start-up mistake; the message is the one line `kvswap serve` prints."""


def _gguf_file(path: str, flag: str) -> None:
    """`path` can be read and starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_GGUF_MAGIC))
    except IsADirectoryError:
        raise StartupError(f"{flag}: '{path}' is a directory, not a GGUF file") from None
    except OSError as e:
        raise StartupError(f"{flag}: cannot read '{path}': {e.strerror}") from None
    if magic != _GGUF_MAGIC:
        raise StartupError(f"{flag}: '{path}' is not a GGUF file (no GGUF magic)")


def _writable_dir(path: str, flag: str) -> None:
    """A file can be created in `path` (tried, not guessed from mode bits: root ignores them)."""
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kvswap-probe-"):
            pass
    except OSError as e:
        raise StartupError(f"{flag}: cannot write in '{path}': {e.strerror}") from None


def check_paths(config: ServerConfig) -> None:
    """Raise StartupError for a model, draft or save path the server could not use."""
    if config.model.path is not None:
        _gguf_file(config.model.path, "-m/--model")
    if config.spec.model_draft is not None:
        _gguf_file(config.spec.model_draft, "-md/--model-draft")
    for lora in config.model.lora:
        _gguf_file(lora.path, "--lora")
    if config.http.slot_save_path is not None:
        _writable_dir(config.http.slot_save_path, "--slot-save-path")


def _tcp_listener(host: str, port: int, v6only: bool) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and v6only:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _unix_listener(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _reason(err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return "address already in use"
    if err.errno == errno.EADDRNOTAVAIL:
        return "address not available on this machine"
    if err.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return err.strerror or str(err)


def bind_listeners(http: HttpSettings) -> list[socket.socket]:
    """One listening socket per --host address, or StartupError (none left open)."""
    n_tcp = sum(1 for host in http.hosts if not host.endswith(".sock"))
    if http.port == 0 and n_tcp > 1:
        raise StartupError("--port 0 is not supported with multiple TCP addresses")
    sockets: list[socket.socket] = []
    try:
        for host in http.hosts:
            if host.endswith(".sock"):
                where = f"--host {host}"
                sockets.append(_unix_listener(host))
            else:
                where = f"--host {host} --port {http.port}"
                sockets.append(_tcp_listener(host, http.port, v6only=n_tcp > 1))
    except socket.gaierror as e:
        _close(sockets)
        raise StartupError(f"{where}: cannot resolve the address: {e.strerror}") from None
    except OSError as e:
        _close(sockets)
        raise StartupError(f"{where}: cannot listen: {_reason(e)}") from None
    return sockets


def listening_urls(sockets: list[socket.socket], scheme: str = "http") -> list[str]:
    """Where the bound sockets listen, for the log (the real port when --port 0)."""
    urls = []
    for sock in sockets:
        if sock.family == socket.AF_UNIX:
            urls.append(f"unix:{sock.getsockname()}")
            continue
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
        urls.append(f"{scheme}://{shown}:{port}")
    return urls


def _close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def remove_unix_sockets(http: HttpSettings) -> None:
    """Unlink the UNIX socket files this server bound (at exit)."""
    for host in http.hosts:
        if host.endswith(".sock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(host)


def _leading_slash(value: str) -> str:
    return value if not value or value.startswith("/") else "/" + value


@dataclass(frozen=True)
class GcpCompat:
    """Vertex AI's custom-container settings (`AIP_*`), None-able: read once at start."""

    port: int
    path_health: str  # "" = only /health
    path_predict: str

    @staticmethod
    def from_environ(environ: Mapping[str, str]) -> GcpCompat | None:
        if environ.get("AIP_MODE", "") != "PREDICTION":
            return None
        return GcpCompat(
            port=int(environ.get("AIP_HTTP_PORT") or "8080"),
            path_health=_leading_slash(environ.get("AIP_HEALTH_ROUTE", "")),
            path_predict=_leading_slash(environ.get("AIP_PREDICT_ROUTE") or "/predict"),
        )
