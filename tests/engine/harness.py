"""Drives a real Engine thread synchronously from tests (no HTTP, no asyncio)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvswap.backend.lora import Adapters
from kvswap.backend.model import Model
from kvswap.core.sampling import SamplingParams
from kvswap.core.types import Completion, EngineError, Event, GenerationRequest
from kvswap.engine.commands import Submit
from kvswap.engine.engine import Engine
from kvswap.engine.plan.geometry import resolve_geometry
from kvswap.engine.runtime import EngineConfig
from kvswap.engine.spec.speculate import SpecConfig

GREEDY = SamplingParams(temperature=0.0)


def make_engine(
    model: Model,
    *,
    n_ctx: int = 1024,
    n_parallel: int = 4,
    kv_unified: bool | None = True,
    n_batch: int = 512,
    n_ubatch: int = 128,
    n_threads: int = 1,
    page_ram_bytes: int = 0,
    cache_ram_bytes: int = 0,
    adapters: Adapters | None = None,
    spec: SpecConfig | None = None,
    draft_model: Model | None = None,
) -> Engine:
    geo = resolve_geometry(
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_unified=kv_unified,
        kv_unified_per_slot=0,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        cache_type_k="f16",
        cache_type_v="f16",
        n_ctx_train=model.info.n_ctx_train,
    )
    config = EngineConfig(
        geometry=geo,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        spec=spec,
        page_ram_bytes=page_ram_bytes,
        cache_ram_bytes=cache_ram_bytes,
        check_integrity=True,  # every byte owner checks itself whenever the engine idles
    )
    engine = Engine(model, config, adapters=adapters, draft_model=draft_model)

    engine.start()
    return engine


@dataclass
class Run:
    """Collects one request's events."""

    events: list[Event] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def sink(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Completion | EngineError):
            self.done.set()

    @property
    def result(self) -> Completion | EngineError:
        assert self.done.wait(120), "request did not finish"
        last = self.events[-1]
        assert isinstance(last, Completion | EngineError)
        return last


_ids = iter(range(1, 1 << 30))


def submit(engine: Engine, request: GenerationRequest) -> tuple[int, Run]:
    run = Run()
    req_id = next(_ids)
    engine.post(Submit(req_id, request, run.sink))
    return req_id, run


def complete(engine: Engine, request: GenerationRequest) -> Completion:
    result = submit(engine, request)[1].result
    assert isinstance(result, Completion), result
    return result


def complete_all(engine: Engine, requests: Sequence[GenerationRequest]) -> list[Completion]:
    runs = [submit(engine, r)[1] for r in requests]
    out = []
    for run in runs:
        result = run.result
        assert isinstance(result, Completion), result
        out.append(result)
    return out


def call(engine: Engine, make) -> object:  # type: ignore[no-untyped-def]
    """Post a verb command built by make(req_id, reply) and wait for its reply."""
    box: list[object] = []
    ready = threading.Event()

    def reply(result: object) -> None:
        box.append(result)
        ready.set()

    cmd = make(next(_ids), reply)
    engine.post(cmd)
    assert ready.wait(60)
    return box[0]


def request(tokens: Sequence[int], n_predict: int = 16, **kw: object) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=tuple(int(t) for t in tokens), sampling=GREEDY, n_predict=n_predict, **kw
    )  # type: ignore[arg-type]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def explain_mismatch(solo: Completion, other: Completion) -> str:
    """SPEC §9: the first divergent position and the top-2 margin there (solo run's probs)."""
    pos = first_divergence(solo.tokens, other.tokens)
    margin = "n/a"
    if 0 <= pos < len(solo.probs) and len(solo.probs[pos].top) >= 2:
        import math

        top = solo.probs[pos].top
        margin = f"{math.log(top[0].prob) - math.log(top[1].prob):.4f} (log-prob)"
    return f"first divergent token at position {pos}; top-2 margin there: {margin}"
