"""`kvswap serve`: parse llama-server's flags, start HTTP, load the model, run until stopped.

The HTTP server starts first and answers 503 "Loading model" (as llama-server) while a loader
thread loads the weights and builds the engine; a load failure stops the process with an error.
SIGINT/SIGTERM stop admission, let running streams finish for a short grace period, cancel the
rest, and exit cleanly.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Sequence

from kvswap import __version__
from kvswap.config import ConfigError, HelpRequested, ServerConfig, format_help, parse_serve_args

log = logging.getLogger("kvswap")

# Seconds SIGTERM waits for running requests before cancelling them.
_GRACEFUL_SHUTDOWN_S = 10
# glibc's mallopt: blocks of this size and more get their own maps, unmapped when freed.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1 << 20


def pin_mmap_threshold() -> None:
    """Keep large blocks out of malloc's arenas, so that freeing them returns them to the OS.

    glibc raises its mmap threshold each time a mapped block is freed; blocks of that size then
    come from the arenas and stay resident once freed. Every sleep and wake (the model, the KV
    cache and libllama's buffers freed, then allocated again on another thread) and every
    reconfigure left tens of MiB more resident. A fixed threshold stops that. No-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def setup_logging(config: ServerConfig) -> None:
    """Root logging from -v/-lv/--log-disable/--log-file; libllama at WARNING unless -v."""
    from kvswap.backend.liblog import route_libllama_logs

    level = (
        logging.DEBUG
        if config.log.verbose
        else {0: logging.ERROR, 1: logging.ERROR, 2: logging.WARNING}.get(
            config.log.verbosity, logging.INFO
        )
    )
    if config.log.log_disable:
        level = logging.CRITICAL + 1
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if config.log.log_file:
        handlers.append(logging.FileHandler(config.log.log_file))
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )
    route_libllama_logs(logging.DEBUG if config.log.verbose else logging.WARNING)
    # the cluster's HTTP client (turns forwarded to other replicas) logs every request at INFO
    logging.getLogger("httpx").setLevel(logging.DEBUG if config.log.verbose else logging.WARNING)


def main(argv: Sequence[str]) -> int:
    try:
        config = parse_serve_args(argv, os.environ)
    except HelpRequested as asked:
        print(f"kvswap {__version__}" if asked.flag == "--version" else format_help())
        return 0
    except ConfigError as err:
        print(f"kvswap serve: {err}", file=sys.stderr)
        return 1
    setup_logging(config)
    pin_mmap_threshold()
    if config.ignored_flags:
        log.warning(
            "accepted but not implemented by kvswap (ignored): %s", ", ".join(config.ignored_flags)
        )
    if config.context.context_shift:
        log.warning(
            "--context-shift: kvswap does not shift context; a request reaching its slot's "
            "window ends with stop_type limit"
        )
    if config.http.server_tools or config.http.mcp_servers:
        log.warning("kvswap runs no built-in tools or MCP servers (--tools, --mcp-servers-*)")
    from kvswap.server.startup import GcpCompat, StartupError, bind_listeners, check_paths

    gcp = GcpCompat.from_environ(os.environ)
    if gcp is not None and gcp.port != config.http.port:  # Vertex AI names the port
        log.warning("Google Cloud Platform compat: AIP_HTTP_PORT %d overrides --port", gcp.port)
        config = dataclasses.replace(config, http=dataclasses.replace(config.http, port=gcp.port))

    try:
        check_paths(config)
        sockets = bind_listeners(config.http)
    except StartupError as err:
        print(f"kvswap serve: error: {err}", file=sys.stderr)
        return 1
    return run(config, sockets)


def run(config: ServerConfig, sockets: list[socket.socket]) -> int:
    """Serve on the bound `sockets` until stopped; 1 when the model failed to load."""
    from kvswap.server.prefetch import ModelPrefetch

    prefetch: ModelPrefetch[Built] = ModelPrefetch(config)  # the weights load meanwhile
    from kvswap.server.enginebuild import Built, build_engine

    # Then the same thread builds the engine (contexts, warm-up) while the HTTP stack imports.
    prefetch.then(lambda model: build_engine(config, model))
    import uvicorn

    from kvswap.server.app import create_app
    from kvswap.server.loader import Loader
    from kvswap.server.startup import listening_urls, remove_unix_sockets

    loader = Loader(config, prefetch)
    scheme = "https" if config.http.ssl_cert_file else "http"
    loader.listening = tuple(listening_urls(sockets, scheme))
    app = create_app(config, loader)
    uv_config = uvicorn.Config(
        app,
        host=config.http.host,
        port=config.http.port,
        log_level="warning",
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=max(5, min(config.http.timeout_s, 600)),
        lifespan="on",
        ssl_keyfile=config.http.ssl_key_file,
        ssl_certfile=config.http.ssl_cert_file,
    )
    server = uvicorn.Server(uv_config)
    loader.on_failure = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=sockets)
    finally:
        loader.close()
        for sock in sockets:
            sock.close()
        remove_unix_sockets(config.http)
    if loader.error is not None:
        print(f"kvswap serve: error: failed to load the model: {loader.error}", file=sys.stderr)
        return 1
    return 0
