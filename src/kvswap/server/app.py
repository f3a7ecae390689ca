"""The FastAPI application: routes, typed errors, the guard, and the loader's lifespan.

`create_app(config, loader)` builds the ASGI app; the loader (model + engine) starts when the
event loop does, and the guard answers 503 until it is ready. One process, one event loop: the
engine thread does the model work, handlers only validate, tokenize, post and shape.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI

from kvswap import __version__
from kvswap.config.settings import ServerConfig
from kvswap.server import forward, routes_web
from kvswap.server.anthropic import routes as routes_anthropic
from kvswap.server.anthropic.errors import AnthropicErrors
from kvswap.server.asgi import ASGIApp
from kvswap.server.cors import CorsMiddleware, cors_policy
from kvswap.server.errors import install_error_handlers
from kvswap.server.forward import Forwarder
from kvswap.server.gcp import GcpCompat
from kvswap.server.gcp import install as install_gcp
from kvswap.server.guard import Guard
from kvswap.server.llama import (
    routes_completion,
    routes_info,
    routes_lora,
    routes_proxy,
    routes_stream,
)
from kvswap.server.loader import Loader
from kvswap.server.openai import (
    routes_chat,
    routes_conversations,
    routes_responses,
    routes_stored,
)
from kvswap.server.openapi import hoist_defs, resolve_bodies
from kvswap.server.pages import routes_cluster, routes_minds, routes_reconfigure, routes_slots
from kvswap.server.peerauth import peer_key
from kvswap.server.requestlog import RequestLog
from kvswap.server.sleep import Sleeper
from kvswap.web import page_paths


def create_app(config: ServerConfig, loader: Loader) -> RequestLog:
    sleeper = Sleeper(loader, config.paging.sleep_idle_seconds)
    forwarders: list[Forwarder] = []
    app = FastAPI(
        title="kvswap",
        version=__version__,
        lifespan=_lifespan(loader, sleeper, forwarders),
        docs_url=None,
        redoc_url=None,
    )
    app.state.loader = loader
    app.state.sleeper = sleeper

    install_error_handlers(app)
    routers = _routers()
    for router in routers:
        app.include_router(router)
    gcp = GcpCompat.from_environ(os.environ)
    if gcp is not None:
        install_gcp(app, gcp, routers)
    inner: ASGIApp = app
    if config.cluster.replica_id is not None:
        forwarder = _cluster(
            app, config.cluster.replica_id, frozenset(config.cluster.peers), loader, routers
        )
        forwarders.append(forwarder)
        inner = forwarder
    app.include_router(routes_web.router(config.http))  # last: a --path folder takes the rest
    app.openapi = _openapi(app, routers)  # type: ignore[method-assign]
    guard = Guard(
        inner,
        api_keys=config.http.api_keys,
        api_prefix=config.http.api_prefix,
        max_body_bytes=config.http.max_body_bytes,
        is_ready=loader.ready,
        sleeper=sleeper,
        page_paths=page_paths(),
    )
    outer = AnthropicErrors(guard, config.http.api_prefix)  # its routes' errors, its shape
    return RequestLog(CorsMiddleware(outer, cors_policy(config.http)))


def _routers() -> list[APIRouter]:
    """The API families' routes, in the order they are matched."""
    return [
        routes_info.router,
        routes_completion.router,
        routes_chat.router,
        routes_anthropic.router,
        routes_responses.router,
        routes_stored.router,
        routes_conversations.router,
        routes_slots.router,
        routes_minds.router,
        routes_reconfigure.router,
        routes_lora.router,
        routes_proxy.router,
        routes_stream.router,
    ]


def _lifespan(
    loader: Loader, sleeper: Sleeper, forwarders: list[Forwarder]
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The loader (model + engine) starts with the event loop; at the end the minds are
    spilled while the engine still runs."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader.start(asyncio.get_running_loop())
        sleeper.start()
        yield
        if loader.state is not None:
            loader.state.streams.close()  # resumable streams' generations end here
        await sleeper.stop()
        for forwarder in forwarders:
            await forwarder.aclose()
        # uvicorn re-raises SIGTERM once serving ends: spill the minds now, engine still running.
        await asyncio.to_thread(loader.before_exit)

    return lifespan


def _cluster(
    app: FastAPI, replica_id: str, peers: frozenset[str], loader: Loader, routers: list[APIRouter]
) -> Forwarder:
    """A replica of a cluster: its own route, and the forwarder in front of the app."""
    app.include_router(routes_cluster.router)
    routers.append(routes_cluster.router)  # after install_gcp: /predict runs no cluster verb
    forward.install(app)
    return Forwarder(
        app,
        replica_id=replica_id,
        peers=peers,
        peer_key=peer_key(loader.config.cluster.shared_tier),
        gate=lambda: loader.state.shared_minds if loader.state is not None else None,
    )


def _openapi(app: FastAPI, routers: list[APIRouter]) -> Callable[[], dict[str, Any]]:
    """The OpenAPI document, built on first read with the request bodies the routes parse."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for router in routers:
                resolve_bodies(router.routes)
            app.openapi_schema = hoist_defs(FastAPI.openapi(app))
        return app.openapi_schema

    return openapi
