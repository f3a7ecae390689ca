"""The pure parts of a reconfigure: the target geometry and where each occupant sits after it."""

from __future__ import annotations

import pytest

from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.plan.geometry import Geometry, ReconfigureSpec
from kvswap.engine.plan.reconfigure import Occupant, plan_seats, target_geometry

CURRENT = Geometry(
    n_ctx=4096, n_parallel=4, kv_unified=True, n_batch=512, n_ubatch=128,
    cache_type_k="f16", cache_type_v="f16", kv_unified_per_slot=0, generation=3,
)  # fmt: skip


def test_omitted_fields_keep_their_values_and_the_generation_grows() -> None:
    geo = target_geometry(CURRENT, ReconfigureSpec(n_parallel=2))
    assert (geo.n_ctx, geo.n_parallel, geo.cache_type_k, geo.generation) == (4096, 2, "f16", 4)
    assert geo.n_batch == 512 and geo.kv_unified


def test_n_ubatch_is_capped_by_n_batch() -> None:
    geo = target_geometry(CURRENT, ReconfigureSpec(n_batch=64, n_ubatch=256))
    assert (geo.n_batch, geo.n_ubatch) == (64, 64)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (ReconfigureSpec(n_parallel=0), "n_parallel must be at least 1"),
        (ReconfigureSpec(n_ctx=0), "n_ctx must be at least 1"),
        (ReconfigureSpec(n_batch=0), "n_batch and n_ubatch"),
        (ReconfigureSpec(cache_type_k="f17"), "unknown KV cache type 'f17'"),
    ],
)
def test_nonsense_is_a_typed_400_naming_the_field(spec: ReconfigureSpec, words: str) -> None:
    with pytest.raises(KvswapError) as err:
        target_geometry(CURRENT, spec)
    assert err.value.kind is ErrorKind.INVALID_REQUEST
    assert words in err.value.message


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(KvswapError) as err:
        target_geometry(CURRENT, ReconfigureSpec(n_parallel=0, n_ctx=0))
    assert "n_parallel" in err.value.message and "n_ctx" in err.value.message


def test_occupants_keep_their_slot_when_it_still_exists() -> None:
    plan = plan_seats([Occupant(0, True, 10), Occupant(2, False, 50)], 3, 1024)
    assert plan.seats == {0: 0, 2: 2} and plan.unseated == {}


def test_running_requests_take_free_lower_slots_before_idle_minds() -> None:
    occupants = [Occupant(1, False, 30), Occupant(3, True, 10), Occupant(2, True, 20)]
    plan = plan_seats(occupants, 2, 1024)
    # Running requests are seated first, in slot order (2 -> 0, 3 -> 1); the idle mind of
    # slot 1 then finds its own seat taken and no other free: it stays a page.
    assert plan.seats[2] == 0 and plan.seats[3] == 1
    assert plan.unseated == {1: "no free slot in the new geometry"}


def test_an_idle_mind_larger_than_the_new_window_stays_a_page() -> None:
    plan = plan_seats([Occupant(0, False, 2048)], 2, 1024)
    assert plan.seats == {}
    assert "larger than the new window" in plan.unseated[0]


def test_an_idle_mind_never_takes_a_running_requests_own_slot() -> None:
    plan = plan_seats([Occupant(3, False, 5), Occupant(0, True, 5)], 2, 1024)
    assert plan.seats == {0: 0, 3: 1}
