"""The FastAPI application: routes, typed errors, the guard, and the loader's lifespan.

`create_app(config, loader)` builds the ASGI app; the loader (model + engine) starts when the
event loop does, and the guard answers 503 until it is ready. One process, one event loop: the
engine thread does the model work, handlers only validate, tokenize, post and shape.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from kvswap import __version__
from kvswap.config.settings import ServerConfig
from kvswap.server import routes_web
from kvswap.server.anthropic import routes as routes_anthropic
from kvswap.server.cors import CorsMiddleware, cors_policy
from kvswap.server.errors import install_error_handlers
from kvswap.server.gcp import GcpCompat
from kvswap.server.gcp import install as install_gcp
from kvswap.server.guard import ASGIApp, Guard
from kvswap.server.llama import routes_completion, routes_info, routes_lora, routes_proxy
from kvswap.server.loader import Loader
from kvswap.server.openai import routes_chat, routes_responses
from kvswap.server.openapi import hoist_defs, resolve_bodies
from kvswap.server.pages import (
    forward,
    routes_cluster,
    routes_minds,
    routes_reconfigure,
    routes_slots,
)
from kvswap.server.pages.forward import Forwarder
from kvswap.server.requestlog import RequestLog
from kvswap.server.sleep import Sleeper
from kvswap.web import page_paths


def create_app(config: ServerConfig, loader: Loader) -> RequestLog:
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
    routers = [
        routes_info.router,
        routes_completion.router,
        routes_chat.router,
        routes_anthropic.router,
        routes_responses.router,
        routes_slots.router,
        routes_minds.router,
        routes_reconfigure.router,
        routes_lora.router,
        routes_proxy.router,
    ]
    for router in routers:
        app.include_router(router)
    gcp = GcpCompat.from_environ(os.environ)
    if gcp is not None:
        install_gcp(app, gcp, routers)
    inner: ASGIApp = app
    if config.cluster.replica_id is not None:
        app.include_router(routes_cluster.router)
        routers.append(routes_cluster.router)  # after install_gcp: /predict runs no cluster verb
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
            for router in routers:
                resolve_bodies(router.routes)
            app.openapi_schema = hoist_defs(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    guard = Guard(
        inner,
        api_keys=config.http.api_keys,
        api_prefix=config.http.api_prefix,
        max_body_bytes=config.http.max_body_bytes,
        is_ready=loader.ready,
        sleeper=sleeper,
        page_paths=page_paths(),
    )
    return RequestLog(CorsMiddleware(guard, cors_policy(config.http)))
