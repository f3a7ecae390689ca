"""The typed errors of the domain: `ErrorKind` names llama-server's error types, and
`KvswapError` carries one to the HTTP layer, which answers `{"error": {code, message, type}}`
with the status `kind.code`. The bottom of the tree: imports nothing of kvswap.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """llama-server's error types; the HTTP status is `code`."""

    INVALID_REQUEST = "invalid_request_error"
    EXCEED_CONTEXT = "exceed_context_size_error"
    AUTHENTICATION = "authentication_error"
    NOT_FOUND = "not_found_error"
    SERVER = "server_error"
    NOT_SUPPORTED = "not_supported_error"
    UNAVAILABLE = "unavailable_error"

    @property
    def code(self) -> int:
        return _ERROR_CODES[self]


_ERROR_CODES = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.EXCEED_CONTEXT: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.SERVER: 500,
    ErrorKind.NOT_SUPPORTED: 501,
    ErrorKind.UNAVAILABLE: 503,
}


class KvswapError(Exception):
    """A typed error for the outside world: becomes `{"error": {code, message, type}}`."""

    def __init__(self, kind: ErrorKind, message: str, **extra: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra  # extra fields llama-server puts beside code/message/type
