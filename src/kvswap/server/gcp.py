"""Google Cloud (Vertex AI) custom-container compatibility, as llama-server's `AIP_MODE`.

With `AIP_MODE=PREDICTION` in the environment (`GcpCompat`, read at start by
`server.startup`), the server listens on
`AIP_HTTP_PORT` (default 8080, over `--port`), serves /health also at `AIP_HEALTH_ROUTE`, and
answers `POST AIP_PREDICT_ROUTE` (default /predict): `{"instances": [...]}`, each instance a
request body plus `"@requestFormat"`, the route it goes to, by path ("/v1/chat/completions")
or camelCase alias ("chatCompletions"). Each instance runs through the app itself (its own
request, concurrently with the others; streaming is turned off) and its JSON answer, an error
included, becomes one of `"predictions"`. At most 128 instances, as llama-server.

Owns the predict route and its dispatch; no I/O of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from kvswap.core.errors import ErrorKind
from kvswap.server.asgi import ASGIApp, Scope
from kvswap.server.errors import error_json
from kvswap.server.internal import call_app
from kvswap.server.startup import GcpCompat

log = logging.getLogger("kvswap.server")


MAX_INSTANCES = 128
_REFRAMED = (b"content-length", b"content-type")  # set anew for each instance


def gcp_alias(path: str) -> str:
    """llama-server's `path_to_gcp_format`: "/v1/chat/completions" -> "chatCompletions"."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = re.split(r"[:{]", s.removeprefix("/"), maxsplit=1)[0]  # stop before path parameters
    return re.sub(r"[/_-]+(.)", lambda m: m.group(1).upper(), s).rstrip("/_-")


def _invalid(message: str) -> dict[str, Any]:
    return error_json(ErrorKind.INVALID_REQUEST, message)


async def predict(
    app: ASGIApp, scope: Scope, body: bytes, routes: Mapping[str, str]
) -> tuple[int, dict[str, Any]]:
    """The predict answer for a request body; `routes`: alias or path -> path of POST routes."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return 400, _invalid(str(err))
    if not isinstance(data, dict):
        return 400, _invalid("request body must be a JSON object")
    instances = data.get("instances")
    if not isinstance(instances, list):
        return 400, _invalid("request body must include an array field named instances")
    if len(instances) > MAX_INSTANCES:
        message = f"instances array exceeds maximum size of {MAX_INSTANCES}"
        return 400, _invalid(message)

    async def one(instance: object) -> object:
        if not isinstance(instance, dict):
            return _invalid("each instance must be a JSON object")
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _invalid("each instance must include a string @requestFormat")
        path = routes.get(fmt)
        if path is None:
            return _invalid(f"no handler registered for @requestFormat: {fmt}")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            log.warning("predict: ignoring the instance's stream field (no streaming here)")
            payload["stream"] = False
        kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _REFRAMED]
        headers = [*kept, (b"content-type", b"application/json")]
        _, _, answer = await call_app(
            app, "POST", path, json.dumps(payload).encode(), headers, scope
        )
        if not answer:
            return None
        try:
            return json.loads(answer)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return answer.decode("utf-8", "replace")

    return 200, {"predictions": list(await asyncio.gather(*(one(i) for i in instances)))}


def post_routes(paths: list[str]) -> dict[str, str]:
    """Every POST path by itself and by its camelCase alias (the first path wins an alias)."""
    out: dict[str, str] = {}
    for path in paths:
        out.setdefault(gcp_alias(path), path)
    for path in paths:
        out[path] = path
    return out


def install(app: FastAPI, gcp: GcpCompat, routers: list[APIRouter]) -> None:
    """Add the predict route (and the health alias) to `app`; `routers`: the app's own."""
    routes = [r for router in routers for r in router.routes if isinstance(r, APIRoute)]
    health = next(r for r in routes if r.path == "/health")
    if gcp.path_health and gcp.path_health != "/health":
        app.add_api_route(
            gcp.path_health, health.endpoint, methods=["GET"], include_in_schema=False
        )
    paths = [r.path for r in routes if "POST" in (r.methods or ())]
    if gcp.path_predict in paths:
        raise ValueError(f"AIP_PREDICT_ROUTE={gcp.path_predict} conflicts with an existing route")
    by_format = post_routes(paths)

    async def predict_route(request: Request) -> JSONResponse:
        status, answer = await predict(app, request.scope, await request.body(), by_format)
        return JSONResponse(answer, status_code=status)

    app.add_api_route(gcp.path_predict, predict_route, methods=["POST"], include_in_schema=False)
