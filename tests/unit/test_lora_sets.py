"""LoRA sets (engine.lora), slot choice by set, and the HTTP view of adapters (server.lora):
pure, no model."""

from __future__ import annotations

import numpy as np
import pytest

from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.plan.lora import SetTurns, lora_set, next_group, refs_of, resolve
from kvswap.engine.plan.scheduler import choose_slot
from kvswap.engine.slot import Slot
from kvswap.server.requests.lora import LoraScales, parse_entries
from kvswap.server.requests.schemas import LoraEntry


def _info(i: int, name: str, scale: float = 1.0) -> AdapterInfo:
    return AdapterInfo(i, f"/a/{name}.gguf", f"{name}-hash", scale, "", "")


A, B, C = _info(0, "a"), _info(1, "b"), _info(2, "c")


def test_a_set_is_sorted_by_id_without_zero_scales_and_a_later_entry_wins() -> None:
    assert lora_set([(2, 0.5), (0, 1.0), (1, 0.0)]) == ((0, 1.0), (2, 0.5))
    assert lora_set([(0, 1.0), (0, 0.0)]) == ()
    assert lora_set([]) == ()


def test_pages_name_adapters_by_hash_and_resolve_under_another_load_order() -> None:
    refs = refs_of(((1, 0.5), (2, 1.0)), (A, B, C))
    assert [(r.sha256, r.path, r.scale) for r in refs] == [
        ("b-hash", "/a/b.gguf", 0.5),
        ("c-hash", "/a/c.gguf", 1.0),
    ]
    reordered = (_info(0, "c"), _info(1, "a"), _info(2, "b"))
    assert resolve(refs, reordered, "the page") == ((0, 1.0), (2, 0.5))
    assert resolve((), (), "the page") == ()


def test_an_adapter_that_is_not_loaded_is_a_typed_400_naming_it() -> None:
    refs = refs_of(((1, 0.5),), (A, B))
    with pytest.raises(KvswapError) as err:
        resolve(refs, (A, C), "page 'x'")
    assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert "page 'x'" in err.value.message and "/a/b.gguf" in err.value.message


def test_sets_take_turns_in_sorted_order() -> None:
    base, one, two = (), ((0, 1.0),), ((1, 0.5),)
    groups = [two, base, one, base]
    assert next_group(groups, None) == base
    assert next_group(groups, base) == one
    assert next_group(groups, one) == two
    assert next_group(groups, two) == base
    # The last group has no work now: the next one after it in order runs.
    assert next_group([base, two], one) == two


def test_a_set_keeps_the_context_for_a_turn_of_steps_while_it_has_work() -> None:
    base, one = (), ((0, 1.0),)
    turns = SetTurns(steps_per_turn=3)
    assert [turns.pick([base, one]) for _ in range(7)] == [base] * 3 + [one] * 3 + [base]
    # Alone, a set keeps the context past its turn; a set with no work loses it at once.
    turns = SetTurns(steps_per_turn=2)
    assert [turns.pick([one]) for _ in range(3)] == [one] * 3
    assert turns.pick([base]) == base
    assert [turns.pick([base, one]) for _ in range(3)] == [base, one, one]


def test_requests_without_lora_take_the_global_scales_as_they_are() -> None:
    scales = LoraScales((_info(0, "a", 1.0), _info(1, "b", 0.0)))
    assert scales.for_request(None) == (((0, 1.0),), ())
    assert scales.for_request([]) == (((0, 1.0),), ())
    scales.set_global([LoraEntry(id=1, scale=0.5)])
    assert scales.for_request(None) == (((1, 0.5),), ())
    assert [a["scale"] for a in scales.adapters_json()] == [0.0, 0.5]


def test_a_request_lora_field_sets_every_unlisted_adapter_to_zero() -> None:
    scales = LoraScales((_info(0, "a", 1.0), _info(1, "b", 1.0)))
    entries = [LoraEntry(id=1, scale=0.25), LoraEntry(id=0, scale=0.0)]
    assert scales.for_request(entries) == (((1, 0.25),), ((0, 0.0), (1, 0.25)))


def test_unknown_ids_and_bodies_that_are_not_arrays_are_typed_400s() -> None:
    scales = LoraScales((A,))
    for call in (
        lambda: scales.for_request([LoraEntry(id=1, scale=1.0)]),
        lambda: scales.set_global([LoraEntry(id=3, scale=1.0)]),
    ):
        with pytest.raises(KvswapError) as err:
            call()
        assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert scales.scales == [1.0]
    with pytest.raises(KvswapError) as err:
        parse_entries(b'{"id": 0, "scale": 1}')
    assert err.value.message == "Request body must be an array"
    for raw in (b"[{}]", b'[{"id": -1, "scale": 1}]', b'[{"id": 0, "scale": "x"}]', b"[", b"\xff"):
        with pytest.raises(KvswapError):
            parse_entries(raw)
    assert parse_entries(b'[{"id": 0, "scale": 2}]') == [LoraEntry(id=0, scale=2.0)]


def test_slot_choice_counts_a_cached_prefix_only_under_the_requests_set() -> None:
    prompt = np.arange(3, 43, dtype=np.int32)
    under_a, plain = Slot(0, 1024, lora=((0, 1.0),)), Slot(1, 1024)
    under_a.tokens.append(prompt[:30])
    plain.tokens.append(prompt[:10])
    under_a.t_last_used, plain.t_last_used = 2.0, 1.0
    assert choose_slot([under_a, plain], prompt, 0.1, set(), ((0, 1.0),)) is under_a
    # Without the adapter the longer prefix is KV of another set: the matching slot wins.
    assert choose_slot([under_a, plain], prompt, 0.1, set(), ()) is plain
    # No slot of the set holds a useful prefix: the least recently used idle slot.
    assert choose_slot([under_a, plain], prompt, 0.1, set(), ((1, 1.0),)) is plain
