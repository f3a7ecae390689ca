"""`kvswap serve`: parse llama-server's flags, start HTTP, load the model, run until stopped.

The HTTP server starts first and answers 503 "Loading model" (as llama-server) while a loader
thread loads the weights and builds the engine; a load failure stops the process with an error.
SIGINT/SIGTERM stop admission, let running streams finish for a short grace period, cancel the
rest, and exit cleanly.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from kvswap import __version__
from kvswap.config import ConfigError, HelpRequested, ServerConfig, format_help, parse_serve_args

log = logging.getLogger("kvswap")

# Seconds SIGTERM waits for running requests before cancelling them.
_GRACEFUL_SHUTDOWN_S = 10


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
    if config.ignored_flags:
        log.warning(
            "accepted but not implemented by kvswap (ignored): %s", ", ".join(config.ignored_flags)
        )
    return run(config)


def run(config: ServerConfig) -> int:
    import uvicorn

    from kvswap.server.app import create_app
    from kvswap.server.loader import Loader

    loader = Loader(config)
    app = create_app(config, loader)
    uv_config = uvicorn.Config(
        app,
        host=config.http.host,
        port=config.http.port,
        log_level="warning",
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=max(5, min(config.http.timeout_s, 600)),
        lifespan="on",
    )
    server = uvicorn.Server(uv_config)
    loader.on_failure = lambda: setattr(server, "should_exit", True)
    try:
        server.run()
    finally:
        loader.close()
    if loader.error is not None:
        log.error("failed to load the model: %s", loader.error)
        return 1
    return 0
