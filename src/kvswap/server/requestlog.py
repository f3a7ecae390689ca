"""One log line per HTTP request, in llama-server's words (`log_server_request`,
`tools/server/server-http.cpp`): `done request: METHOD PATH ADDR STATUS`, once the answer has
been sent. The routes clients poll (/health, /models, /props, /metrics) are not logged, as
llama-server skips them; nor are the GETs of /slots and /pages, which the web page polls every
second (a tab left open would otherwise log two lines a second). An ASGI wrapper around the whole app, so refusals of the guard (401,
413, 503) are logged too. Logged at INFO: shown at the default verbosity.
"""

from __future__ import annotations

import logging

from kvswap.server.asgi import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("kvswap.http")

# llama-server's list: requests sent regularly, not logged to avoid log spam.
QUIET_PATHS = frozenset({"/health", "/v1/health", "/models", "/v1/models", "/props", "/metrics"})
# kvswap's: what the web page polls (a POST to a slot or a page verb is logged).
QUIET_GETS = frozenset({"/slots", "/pages"})


def _quiet(scope: Scope) -> bool:
    path = scope.get("path", "")
    return path in QUIET_PATHS or (path in QUIET_GETS and scope.get("method") == "GET")


class RequestLog:
    """Wraps an ASGI app; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _quiet(scope):
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client") or ("", 0)
            log.info(
                "done request: %s %s %s %d",
                scope.get("method", ""),
                scope["path"],
                client[0],
                status,
            )
