"""The shared tier's Redis keys of a mind: derived from its tenant namespace and its name, so two
tenants' minds of one name never share a key, and stable across the typed-key change."""

from __future__ import annotations

import pytest

from kvswap.core.keys import PUBLIC_NAMESPACE, anon_key, mind_key, namespace_of
from kvswap.tiers.shared.keys import MindKeys, mind_id, mind_tag


def test_two_tenants_minds_of_one_name_never_share_a_key() -> None:
    a, b = mind_key(namespace_of("key-a"), "alice"), mind_key(namespace_of("key-b"), "alice")
    assert mind_tag(a) != mind_tag(b)
    assert MindKeys.of(a).lease != MindKeys.of(b).lease
    assert MindKeys.of(a) == MindKeys.of(mind_key(namespace_of("key-a"), "alice"))


def test_the_tag_digests_the_string_key_of_earlier_versions() -> None:
    # a tier published before typed keys is found again: "mind~<namespace>~<name in hex>"
    key = mind_key(PUBLIC_NAMESPACE, "alice")
    assert mind_id(key) == "mind~public~616c696365"
    assert MindKeys.of(key).lease == "kv:{332c43e1fd119dee27a0388ac6f28424}:lease"


def test_a_name_with_braces_keeps_one_hash_tag() -> None:
    keys = MindKeys.of(mind_key(PUBLIC_NAMESPACE, "{x}:y"))
    assert keys.lease.count("{") == keys.lease.count("}") == 1


def test_only_minds_have_shared_keys() -> None:
    with pytest.raises(AssertionError):
        mind_id(anon_key(1))
