"""Which mind a request names: the body's "mind" and the X-Mind-Id header name one mind, the
header read as UTF-8; a disagreement or a header that is not UTF-8 is a typed 400."""

from __future__ import annotations

import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PUBLIC_NAMESPACE, mind_key, namespace_of
from kvswap.minds.names import mind_name, request_mind, side_mind

NAME = "ünï cødé"


def as_http(text: str) -> str:
    """A header value as the ASGI server hands it over: its UTF-8 bytes read as Latin-1."""
    return text.encode("utf-8").decode("latin-1")


def test_a_utf8_header_and_the_body_name_the_same_mind() -> None:
    by_header = request_mind(as_http(NAME), None, namespace=PUBLIC_NAMESPACE)
    by_body = request_mind(None, NAME, namespace=PUBLIC_NAMESPACE)
    both = request_mind(as_http(NAME), NAME, namespace=PUBLIC_NAMESPACE)
    assert by_header == by_body == both == mind_key(PUBLIC_NAMESPACE, NAME)


@pytest.mark.parametrize(
    ("header", "body"),
    [("x1", "x2"), ("caf\xe9", None)],
    ids=["header-and-body-disagree", "header-not-utf8"],
)
def test_an_ambiguous_or_garbled_name_is_a_400(header: str, body: str | None) -> None:
    with pytest.raises(KvswapError) as err:
        request_mind(header, body, namespace=PUBLIC_NAMESPACE)
    assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert "X-Mind-Id" in err.value.message


def test_names_are_shown_only_to_their_own_key() -> None:
    key = request_mind("zed", None, namespace=namespace_of("ka"))
    assert key is not None and key.namespace == namespace_of("ka")
    assert mind_name(key, namespace_of("ka")) == "zed"
    assert mind_name(key, namespace_of("kb")) is None
    assert mind_name(None, namespace_of("ka")) is None


def test_a_side_mind_is_its_sessions_own_and_a_long_session_key_still_names_one() -> None:
    """A side request's mind lives in its session's namespace and is named after it; a session
    key at the longest a mind name may be still gives a valid, distinct name per conversation
    (a session key never fails a request)."""
    digest = "ab" * 32
    session = mind_key(namespace_of("k1"), "sess-1")
    side = side_mind(session, digest)
    assert side.namespace == session.namespace and side.name == "sess-1~side-" + "ab" * 8
    longest = mind_key(PUBLIC_NAMESPACE, "s" * 100)
    one, two = side_mind(longest, digest), side_mind(longest, "cd" * 32)
    assert one.name.startswith("side-") and one != two
    assert mind_key(PUBLIC_NAMESPACE, one.name) == one
