"""Which mind a request names, in the namespace of the tenant its API key belongs to; and the
name a caller may see of a mind.

A request names a mind, in this order (the first one given wins):
1. the `X-Mind-Id` header, and the body's `"mind"` (both given and different: a typed 400);
2. a session key, which clients send without asking for a mind: the body's `prompt_cache_key`
   (OpenAI's chat completions and Responses), then the session headers in their listed order
   (`X-Conversation-Id`, llama-server's; `x-claude-code-session-id`, Claude Code's; more with
   `--session-header`). The key is the mind's name, so `/pages` and `POST /minds/{name}` show
   and move it as any mind; a key a mind name cannot be (over `MIND_NAME_MAX_BYTES`, control
   characters, not UTF-8) names the mind `session-<SHA-256 of the key>` instead: a cache key
   never fails a request. Another conversation on a session's key (a side request:
   `server.requests.resent.side_request`) names its own mind, `side_mind`.

Pure. The header's text is taken as HTTP hands it over (its bytes read as Latin-1) and read
back as UTF-8, so the header and the body name the same mind for any name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import MIND_NAME_MAX_BYTES, PageKey, mind_key


def request_mind(
    header: str | None, body_mind: str | None, namespace: str, session: str | None = None
) -> PageKey | None:
    """The mind a request names in its tenant's `namespace` (`header`: the X-Mind-Id value, as
    HTTP hands it over; `session`: its session key's mind name, `session_mind`); None when it
    names none. A typed 400 when the header and the body disagree or the header is not UTF-8."""
    named = _header_utf8(header)
    if body_mind is not None and named is not None and body_mind != named:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f'the X-Mind-Id header ({named!r}) and the body\'s "mind" ({body_mind!r}) name '
            "different minds",
        )
    name = body_mind if body_mind is not None else named
    if name is None:
        name = session
    if name is None:
        return None
    return mind_key(namespace, name)


def session_mind(body_key: object, headers: Sequence[str | None]) -> str | None:
    """The mind name a session key gives: the body's `prompt_cache_key` (a non-empty string),
    else the first non-empty of `headers` (session header values as HTTP hands them over, in
    the listed order); None when the request carries none."""
    if isinstance(body_key, str) and body_key:
        return _as_mind_name(body_key.encode("utf-8", "surrogatepass"))
    for value in headers:
        if value:
            return _as_mind_name(value.encode("latin-1", "replace"))
    return None


def side_mind(session: PageKey, digest: str) -> PageKey:
    """The own mind of a side request on mind `session`'s key (`digest`: what tells its
    conversation from the session's other side conversations, hex): `<session>~side-<16 hex>`,
    or `side-<SHA-256 of both>` when that name would be too long. In the session's namespace."""
    name = f"{session.name}~side-{digest[:16]}"
    if len(name.encode("utf-8")) > MIND_NAME_MAX_BYTES:
        name = "side-" + hashlib.sha256(f"{session.name}\n{digest}".encode()).hexdigest()
    return mind_key(session.namespace, name)


def _as_mind_name(raw: bytes) -> str:
    """The key itself when a mind may be named so, else `session-<SHA-256 of its bytes>`."""
    try:
        text = raw.decode("utf-8")
        return mind_key("-", text).name  # the same rules as any mind name
    except (UnicodeError, KvswapError):
        return "session-" + hashlib.sha256(raw).hexdigest()


def _header_utf8(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError as err:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST, "the X-Mind-Id header must be UTF-8 text"
        ) from err


def mind_name(key: PageKey | None, namespace: str) -> str | None:
    """The name of mind `key` as a caller of `namespace` may see it: None for another
    tenant's mind (or no mind)."""
    if key is None or key.namespace != namespace:
        return None
    return key.name
