"""The typed errors of the domain: `ErrorKind` names llama-server's error types, and
`KvswapError` carries one to the HTTP layer, which answers `{"error": {code, message, type}}`
with the status `kind.code`; `ContextInitError` is the backend's refusal to build a context,
which a reconfigure rolls back on. The bottom of the tree: imports nothing of kvswap.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """llama-server's error types; the HTTP status is `code`."""

    INVALID_REQUEST = "invalid_request_error"
    EXCEED_CONTEXT = "exceed_context_size_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    SERVER = "server_error"
    NOT_SUPPORTED = "not_supported_error"
    UNAVAILABLE = "unavailable_error"
    RATE_LIMIT = "rate_limit_error"  # kvswap's: a key past a per-key limit (429)

    @property
    def code(self) -> int:
        return _ERROR_CODES[self]


_ERROR_CODES = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.EXCEED_CONTEXT: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.PERMISSION: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.SERVER: 500,
    ErrorKind.NOT_SUPPORTED: 501,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.RATE_LIMIT: 429,
}


# OpenAI's code for a prompt longer than the context (its clients match on it: Codex compacts
# its conversation), carried in `code` beside llama-server's `exceed_context_size_error` type.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class KvswapError(Exception):
    """A typed error for the outside world: becomes `{"error": {code, message, type}}`."""

    def __init__(self, kind: ErrorKind, message: str, **extra: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra  # extra fields llama-server puts beside code/message/type


# Domain errors: raised where the fact is known, typed by class; each declares its kind once
# here, and the HTTP layer answers `kind.code` (server.errors).


class PageNotFound(KvswapError):
    """No page is stored under the name."""

    def __init__(self, name: str) -> None:
        super().__init__(ErrorKind.NOT_FOUND, f"no page named {name!r}")
        self.name = name


class PageTooLarge(KvswapError):
    """A page larger than the whole page store: it can never be stored."""

    def __init__(self, n_bytes: int, ceiling_bytes: int) -> None:
        super().__init__(
            ErrorKind.INVALID_REQUEST,
            f"the page needs {n_bytes} bytes, more than the whole page store "
            f"(--page-ram-bytes {ceiling_bytes})",
        )
        self.n_bytes, self.ceiling_bytes = n_bytes, ceiling_bytes


class StoreFull(KvswapError):
    """The page store cannot take the page now (it may later)."""

    def __init__(self, charged_bytes: int, ceiling_bytes: int, n_bytes: int) -> None:
        super().__init__(
            ErrorKind.UNAVAILABLE,
            f"the page store is full: {charged_bytes} of {ceiling_bytes} bytes held, the page "
            f"needs {n_bytes}",
        )
        self.n_bytes = n_bytes
        self.short_bytes = charged_bytes + n_bytes - ceiling_bytes  # what would make it fit


class StoreOff(KvswapError):
    """The feature needs the page store, and this server runs without one."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.NOT_SUPPORTED, message)


class MindUnavailable(KvswapError):
    """A mind cannot be served here now (its owner is unreachable, the shared tier is away);
    the client may retry after `retry_after_s` (the answer's Retry-After)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(ErrorKind.UNAVAILABLE, message)
        self.retry_after_s = retry_after_s


class MindMovedToDisk(KvswapError):
    """The mind went to disk (a switch moved it straight there, the page store being full)
    after its request looked for it: the request reads it back and is sent again. Never
    answered to a client."""

    def __init__(self, name: str) -> None:
        super().__init__(
            ErrorKind.UNAVAILABLE, f"mind {name!r} moved to disk while its request waited"
        )


class ContextInitError(RuntimeError):
    """libllama could not build a context with the requested geometry."""
