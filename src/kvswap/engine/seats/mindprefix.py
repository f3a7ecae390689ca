"""A new mind's head start from its tenant's other minds: the RAM page or the resident slot sharing
the longest prefix with its first prompt.

Sessions of one agent open alike (Claude Code's system prompt and tools are the same 6-13k
tokens in every session, Codex's likewise), so a new session's first prompt shares most of its
tokens with every earlier session of the tenant. The anonymous cache holds no mind's state, so
without this each new session prefilled that opening again, where llama-server's prompt cache
found it. `best_mind_page` finds the tenant's mind page in RAM that shares the most with the
prompt; `AnonCache.seed` copies it into the new mind's slot (the page stays, as an anonymous
entry does) and the turn keeps only the common prefix; `best_resident` finds the tenant's slot
(another session's mind in it, running or idle), whose cells the new mind then shares in a
unified pool (`SlotVerbs.share_prefix`: no copy at all; a subagent's first turn beside its
session's). Only the tenant's own minds: one key's minds never seed another's. Off in a
cluster: a turn retried on another replica (after a miss, a failover) must write the same
answer, and a prefix computed by another mind's prefill differs from a fresh one in its last
bits, which greedy decoding may follow. Engine thread; a page the demoter drops meanwhile is
skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kvswap.core.errors import PageNotFound
from kvswap.core.keys import PageKey, PageKind
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.slot import Slot


def best_mind_page(
    store: PageStore, prompt: npt.NDArray[np.int32], namespace: str
) -> tuple[PageKey, int] | None:
    """Tenant `namespace`'s mind page sharing the longest prefix with `prompt` (its last token
    aside: it is always evaluated), and that length; None when no page shares a token."""
    head = prompt[: len(prompt) - 1]
    best: tuple[PageKey, int] | None = None
    for info in store.infos():
        key = info.key
        if key.kind is not PageKind.MIND or key.namespace != namespace or not info.in_store:
            continue
        try:
            page = store.hold(key)
        except PageNotFound:
            continue  # dropped since the listing
        try:
            layout = page.layout
            if layout.token_only:
                continue
            span = layout.tokens
            with page.view() as view:
                tokens = np.frombuffer(view[span.offset : span.end], dtype=np.int32)
                n = min(len(tokens), len(head))
                diff = np.flatnonzero(tokens[:n] != head[:n])
                common = int(diff[0]) if len(diff) else n
                del tokens  # no view of the buffer outlives the hold
        finally:
            store.release(page)
        if common > 0 and (best is None or common > best[1]):
            best = (key, common)
    return best


def best_resident(
    slots: Sequence[Slot], slot: Slot, prompt: npt.NDArray[np.int32], namespace: str
) -> tuple[Slot, int] | None:
    """The other slot of tenant `namespace` (a mind's, or an anonymous prompt it sent) holding
    the longest prefix of `prompt` (its last token aside), and that length; None when none
    shares a token. A running slot counts: what it holds up to now stays."""
    head = prompt[: len(prompt) - 1]
    best: tuple[Slot, int] | None = None
    for other in slots:
        owner = other.mind.namespace if other.mind is not None else other.namespace
        if other is slot or owner != namespace or len(other.tokens) == 0:
            continue
        common = other.tokens.common_prefix(head)
        if common > 0 and (best is None or common > best[1]):
            best = (other, common)
    return best
