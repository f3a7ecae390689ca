"""Waiting work and slot choice: which queued job starts on which idle slot, in what order.

Pure (slots are read, never changed). Rules, as llama-server plus ordering it lacks:
- A job pinned to a slot (`id_slot`, or a slot verb) starts when that slot is idle and no
  earlier job for the same slot is still waiting: work on one slot runs in arrival order.
- An unpinned request takes the idle slot whose cached tokens share the longest prefix with its
  prompt (as a fraction of the prompt, above `--slot-prompt-similarity`), else the least recently
  used idle slot. Unpinned requests start in arrival order: when one finds no slot, the later
  ones wait behind it (it is never dropped or overtaken).
- Minds (engine.seats): a request naming a mind resident in a slot waits for that slot; one
  naming a mind not resident takes an idle slot, preferring an empty one, then one holding an
  anonymous cache, then the least recently used idle mind's (the engine pages that mind out
  first). An anonymous request never matches a prefix in a mind's slot and takes a mind's slot
  only when every idle slot holds a mind.
- Tenants: an anonymous request's prefix counts only in slots its own tenant (API key) left
  (`Slot.prefix_for`): another key's prompt is never a cache hit, so `cache_n` tells no key
  what another sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey
from kvswap.core.types import GenerationRequest, LoraSet
from kvswap.engine.slot import Slot


@dataclass
class Job:
    """A queued unit of work for the engine thread."""

    req_id: int
    slot_id: int  # -1: any slot (generation requests only)
    prompt: npt.NDArray[np.int32] | None = None  # for slot choice; None for slot verbs
    payload: object = None  # the command that created the job
    cancelled: bool = False
    lora: LoraSet = ()  # a request's LoRA set: only its slots' prefixes count
    mind: PageKey | None = None  # the mind the request names (None: anonymous)
    namespace: str = PUBLIC_NAMESPACE  # the tenant of an anonymous request
    adopt: bool = False  # a mind in no slot may take an anonymous slot holding its prefix
    held_since: float | None = None  # perf_counter when it first waited for room to start

    def held_ms(self) -> float:
        """How long the job waited for room to start (`WaitQueue.put_back`), ms; 0 if never."""
        return 0.0 if self.held_since is None else (time.perf_counter() - self.held_since) * 1e3

    @staticmethod
    def of(
        req_id: int, request: GenerationRequest, prompt: npt.NDArray[np.int32], cmd: object
    ) -> Job:
        """A generation request's job (a mind's runs on the slot where the mind lives)."""
        mind = request.mind
        slot_id = -1 if mind else request.id_slot
        return Job(
            req_id, slot_id, prompt, cmd, False, request.lora, mind, request.namespace,
            request.adopt_prefix,
        )  # fmt: skip


def choose_slot(
    slots: Sequence[Slot],
    prompt: npt.NDArray[np.int32],
    similarity: float,
    taken: set[int],
    lora: LoraSet = (),
    mind: PageKey | None = None,
    namespace: str = PUBLIC_NAMESPACE,
    adopt: bool = False,
) -> Slot | None:
    """The idle slot an unpinned request should take, or None when none is idle. A slot's
    cached prefix counts only when it was computed under the request's LoRA set, for the
    request's own tenant (`namespace`). A mind takes its own slot; one in no slot its seat
    order, or with `adopt` first an anonymous slot holding enough of its prompt (a stored
    conversation's new mind adopts the KV its first, mind-less turn left there)."""
    idle = [s for s in slots if s.is_idle and s.id not in taken]
    free = [s for s in idle if s.mind is None]
    if mind:
        home = next((s for s in slots if s.mind == mind), None)
        if home is not None:
            return home if home in idle else None
        best = _best_prefix(free, prompt, similarity, lora, mind.namespace) if adopt else None
        return best or min(idle, key=_seat_order, default=None)
    if not idle:
        return None
    best = _best_prefix(free, prompt, similarity, lora, namespace)
    return best or min(free or idle, key=lambda s: s.t_last_used)


def _best_prefix(
    free: Sequence[Slot],
    prompt: npt.NDArray[np.int32],
    similarity: float,
    lora: LoraSet,
    namespace: str,
) -> Slot | None:
    """The anonymous slot sharing the largest part of `prompt` (above `similarity`), of
    tenant `namespace`'s prefixes."""
    if similarity <= 0.0 or len(prompt) == 0:
        return None
    best: Slot | None = None
    best_sim = 0.0
    for slot in free:
        if len(slot.tokens) == 0 or slot.lora != lora:
            continue
        sim = slot.prefix_for(prompt, namespace) / len(prompt)
        if sim > best_sim and sim > similarity:
            best, best_sim = slot, sim
    return best


def _seat_order(slot: Slot) -> tuple[bool, bool, float]:
    """A mind's seat: empty slots, then anonymous caches, then minds; each by least recent use."""
    return (slot.mind is not None, len(slot.tokens) > 0, slot.t_last_used)


@dataclass
class WaitQueue:
    """Jobs waiting for a slot, in arrival order."""

    similarity: float
    jobs: list[Job] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job) -> None:
        self.jobs.append(job)

    def put_back(self, job: Job) -> None:
        """A job that found no room to start (a page buffer, the demoter's room, a mind's
        hand-off to disk) goes back to the head of the queue; its wait is timed from now on."""
        if job.held_since is None:
            job.held_since = time.perf_counter()
        self.jobs.insert(0, job)

    def remove(self, req_id: int) -> Job | None:
        for i, job in enumerate(self.jobs):
            if job.req_id == req_id:
                return self.jobs.pop(i)
        return None

    def startable(self, slots: Sequence[Slot]) -> Iterator[tuple[Job, Slot]]:
        """Yield (job, slot) pairs that may start now, removing them from the queue.

        The caller starts each job before asking for the next pair: a slot verb finishes at once
        and leaves its slot idle, so the next job for that slot can start in the same pass.
        """
        waiting_on: set[int] = set()  # slots with an earlier job still waiting
        taken: set[int] = set()  # slots given to a generation in this pass
        unpinned_blocked = False
        i = 0
        while i < len(self.jobs):
            job = self.jobs[i]
            slot: Slot | None
            if job.slot_id >= 0:
                slot = slots[job.slot_id]
                if job.slot_id in waiting_on or job.slot_id in taken or not slot.is_idle:
                    waiting_on.add(job.slot_id)
                    i += 1
                    continue
            else:
                if unpinned_blocked:
                    i += 1
                    continue
                assert job.prompt is not None
                # A mind's home slot is found even when other work waits on it (then it waits).
                slot = choose_slot(
                    slots,
                    job.prompt,
                    self.similarity,
                    taken | waiting_on,
                    job.lora,
                    job.mind,
                    job.namespace,
                    job.adopt,
                )
                if slot is None:
                    unpinned_blocked = True
                    i += 1
                    continue
            self.jobs.pop(i)
            yield job, slot
            if not slot.is_idle:
                taken.add(slot.id)
