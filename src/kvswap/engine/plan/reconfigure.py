"""The pure part of a reconfigure (docs/DESIGN.md, "How large a mind can grow"): the target geometry of what a client asks for
(`plan.geometry.ReconfigureSpec`), the memory check, and which new slot each occupied slot's
state goes to. No libllama calls, no engine state: the procedure that uses them is
`engine.reconfigure`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvswap.backend.info import ModelInfo
from kvswap.config.values import KV_CACHE_TYPES
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.plan.geometry import Geometry, ReconfigureSpec


def target_geometry(current: Geometry, spec: ReconfigureSpec) -> Geometry:
    """The new geometry: the spec's fields over the current ones; typed 400 on nonsense."""
    geo = replace(
        current,
        n_ctx=spec.n_ctx if spec.n_ctx is not None else current.n_ctx,
        n_parallel=spec.n_parallel if spec.n_parallel is not None else current.n_parallel,
        cache_type_k=spec.cache_type_k or current.cache_type_k,
        cache_type_v=spec.cache_type_v or current.cache_type_v,
        n_batch=spec.n_batch if spec.n_batch is not None else current.n_batch,
        n_ubatch=spec.n_ubatch if spec.n_ubatch is not None else current.n_ubatch,
        generation=current.generation + 1,
    )
    problems = []
    if geo.n_parallel < 1:
        problems.append("n_parallel must be at least 1")
    if geo.n_ctx < 1:
        problems.append("n_ctx must be at least 1")
    if geo.n_batch < 1 or geo.n_ubatch < 1:
        problems.append("n_batch and n_ubatch must be at least 1")
    for name in (geo.cache_type_k, geo.cache_type_v):
        if name not in KV_CACHE_TYPES:
            problems.append(f"unknown KV cache type {name!r} (one of {', '.join(KV_CACHE_TYPES)})")
    if not problems and (reason := geo.unbuildable_reason()) is not None:
        problems.append(reason)
    if problems:
        raise KvswapError(ErrorKind.INVALID_REQUEST, "; ".join(problems))
    return replace(geo, n_ubatch=min(geo.n_ubatch, geo.n_batch))


# Bytes per KV element of each cache type (quantized blocks of 32 values).
_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
               "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}  # fmt: skip


def kv_bytes_estimate(info: ModelInfo, geo: Geometry) -> int:
    """An upper bound of the KV pool's size (every layer counted as attention)."""
    if info.n_head <= 0 or info.n_head_kv <= 0:
        return 0
    head_dim = info.n_embd // info.n_head
    per_elem = _TYPE_BYTES[geo.cache_type_k] + _TYPE_BYTES[geo.cache_type_v]
    return int(geo.n_ctx * info.n_layer * info.n_head_kv * head_dim * per_elem)


def check_memory(info: ModelInfo, geo: Geometry, available_bytes: int) -> None:
    """Refuse a geometry whose KV pool could not fit in memory (libllama would be OOM-killed)."""
    need = kv_bytes_estimate(info, geo)
    if need > 0.9 * available_bytes:
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            f"the new geometry needs about {need / 2**30:.1f} GiB of KV cache and "
            f"{available_bytes / 2**30:.1f} GiB of memory is available: nothing changed",
        )


@dataclass(frozen=True)
class Occupant:
    """An occupied slot, as the seat planner sees it."""

    slot_id: int
    running: bool
    n_tokens: int


@dataclass(frozen=True)
class SeatPlan:
    seats: dict[int, int]  # old slot -> new slot
    unseated: dict[int, str]  # old slot -> why it stays a page


def plan_seats(occupants: list[Occupant], n_parallel: int, n_ctx_slot: int) -> SeatPlan:
    """Seats in the new geometry: running requests first (their own slot, else the lowest
    free one), then idle minds (their own slot, else the lowest free one) if they fit."""
    seats: dict[int, int] = {}
    unseated: dict[int, str] = {}
    taken: set[int] = set()
    for group in ([o for o in occupants if o.running], [o for o in occupants if not o.running]):
        for occ in sorted(group, key=lambda o: o.slot_id):
            if not occ.running and occ.n_tokens >= n_ctx_slot:
                unseated[occ.slot_id] = (
                    f"larger than the new window ({occ.n_tokens} >= {n_ctx_slot} tokens)"
                )
                continue
            if occ.slot_id < n_parallel and occ.slot_id not in taken:
                seat = occ.slot_id
            else:
                free = [
                    s
                    for s in range(n_parallel)
                    if s not in taken and not any(o.slot_id == s and o.running for o in occupants)
                ]
                if not free:
                    unseated[occ.slot_id] = "no free slot in the new geometry"
                    continue
                seat = free[0]
            seats[occ.slot_id] = seat
            taken.add(seat)
    return SeatPlan(seats, unseated)
