"""The FastAPI application: routes, typed errors, the guard, and the loader's lifespan.

`create_app(config, loader)` builds the ASGI app; the loader (model + engine) starts when the
event loop does, and the guard answers 503 until it is ready. One process, one event loop: the
engine thread does the model work, handlers only validate, tokenize, post and shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from kvswap import __version__
from kvswap.config.settings import ServerConfig
from kvswap.server import routes_web
from kvswap.server.anthropic import routes as routes_anthropic
from kvswap.server.errors import install_error_handlers
from kvswap.server.guard import ASGIApp, Guard
from kvswap.server.llama import routes_completion, routes_info, routes_lora
from kvswap.server.loader import Loader
from kvswap.server.openai import routes_chat, routes_responses
from kvswap.server.openapi import hoist_defs
from kvswap.server.pages import forward, routes_cluster, routes_reconfigure, routes_slots
from kvswap.server.pages.forward import Forwarder
from kvswap.server.sleep import Sleeper
from kvswap.web import page_paths


def create_app(config: ServerConfig, loader: Loader) -> Guard:
    sleeper = Sleeper(loader, config.paging.sleep_idle_seconds)
    forwarder: Forwarder | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import asyncio

        loader.start(asyncio.get_running_loop())
        sleeper.start()
        yield
        await sleeper.stop()
        if forwarder is not None:
            await forwarder.aclose()

        # uvicorn re-raises SIGTERM once serving ends: spill the minds now, engine still running.
        await asyncio.to_thread(loader.before_exit)

    app = FastAPI(
        title="kvswap", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.loader = loader
    app.state.sleeper = sleeper

    install_error_handlers(app)
    app.include_router(routes_info.router)
    app.include_router(routes_completion.router)
    app.include_router(routes_chat.router)
    app.include_router(routes_anthropic.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_slots.router)
    app.include_router(routes_reconfigure.router)
    app.include_router(routes_lora.router)
    inner: ASGIApp = app
    if config.cluster.replica_id is not None:
        app.include_router(routes_cluster.router)
        forward.install(app)
        forwarder = Forwarder(
            app,
            replica_id=config.cluster.replica_id,
            gate=lambda: loader.state.cluster if loader.state is not None else None,
        )
        inner = forwarder
    app.include_router(routes_web.router(config.http))  # last: a --path folder takes the rest

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = hoist_defs(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return Guard(
        inner,
        api_keys=config.http.api_keys,
        api_prefix=config.http.api_prefix,
        max_body_bytes=config.http.max_body_bytes,
        is_ready=loader.ready,
        sleeper=sleeper,
        page_paths=page_paths(),
    )
