"""Geometry that libllama would abort on is refused with a message, before any context exists."""

from __future__ import annotations

import pytest

from kvswap.engine.plan.geometry import resolve_geometry


def _resolve(n_ctx: int, n_parallel: int, n_batch: int) -> object:
    return resolve_geometry(
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_unified=False,
        kv_unified_per_slot=0,
        n_batch=n_batch,
        n_ubatch=n_batch,
        cache_type_k="f16",
        cache_type_v="f16",
        n_ctx_train=4096,
    )


@pytest.mark.parametrize(("n_ctx", "n_parallel", "n_batch"), [(1, 2, 2048), (4096, 4, 3)])
def test_fewer_batch_outputs_than_slots_is_refused(
    n_ctx: int, n_parallel: int, n_batch: int
) -> None:
    with pytest.raises(ValueError, match=r"must each be at least n_parallel"):
        _resolve(n_ctx, n_parallel, n_batch)


def test_the_smallest_buildable_geometry_is_accepted() -> None:
    _resolve(2, 2, 2)
