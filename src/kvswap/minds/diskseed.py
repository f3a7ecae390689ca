"""A new mind's first turn started from a prefix one of its tenant's minds on disk holds.

A new mind starts from the longest prefix of its prompt that its tenant's slots, cached prompts
or mind pages in RAM hold (`engine.seats.anoncache`, `mindprefix`): a coding agent's next session,
a subagent, shares the tenant's long system prompt and tools. When none of the tenant's minds is
in a slot or RAM (after a restart, or under RAM pressure that spilled them all) that prefix lives
on disk only, and the new mind would prefill it again. `DiskSeeds.donor` reads the token header
(not the state) of the tenant's few most recently used minds on disk and names the one sharing
the longest prefix with the prompt; the turn then reads that mind's state and hands it to the
engine as a seed (`Submit.seeds`): the new mind starts from it, keeps the shared prefix and
drops the rest, and is counted as new, never as the donor's history.

A donor is read only when it pays: its prefix is at least `MIN_PREFIX` tokens and the donor
holds at most `MAX_DONOR_RATIO` times that (a read costs the donor's whole state). Another
tenant's minds are never read. Blocking (file reads): called on an I/O worker. No libllama.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvswap.core.keys import PageKey, PageKind
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.seats.registry import MindRegistry
from kvswap.files import FilesError

log = logging.getLogger("kvswap.minds")

MIN_PREFIX = 256  # tokens: a shorter prefix prefills faster than a donor is read
MAX_DONOR_RATIO = 4  # a donor holds at most this many times the prefix it gives
N_CANDIDATES = 4  # the tenant's most recently used minds on disk whose tokens are read


@dataclass(frozen=True)
class DiskSeeds:
    """See the module docstring. `heads(key)`: the tokens of mind `key`'s file (its header
    only; FilesError when it has none)."""

    registry: MindRegistry
    store: PageStore
    heads: Callable[[PageKey], npt.NDArray[np.int32]]

    def donor(self, key: PageKey, prompt: npt.NDArray[np.int32]) -> tuple[PageKey, int] | None:
        """The tenant's mind on disk to seed new mind `key` from, and the prefix it gives;
        None when a mind of the tenant lives in a slot or RAM (the engine seeds from those) or
        no mind on disk pays its read."""
        namespace = key.namespace
        if self._tenant_live(namespace):
            return None
        copies = self.registry.disk_copies()
        last = self.registry.last_used()
        ours = [k for k in copies if k.namespace == namespace and k != key]
        ours.sort(key=lambda k: last.get(k, 0.0), reverse=True)
        head = prompt[: len(prompt) - 1]  # its last token is always evaluated
        best: tuple[PageKey, int] | None = None
        for other in ours[:N_CANDIDATES]:
            try:
                tokens = self.heads(other)
            except FilesError as err:
                log.debug("mind %s: no seed from %s (%s)", key, other, err)
                continue
            n = _common_prefix(tokens, head)
            pays = n >= MIN_PREFIX and len(tokens) <= MAX_DONOR_RATIO * n
            if pays and (best is None or n > best[1]):
                best = (other, n)
        return best

    def _tenant_live(self, namespace: str) -> bool:
        """A mind of the tenant is in a slot or a RAM page."""
        if any(k.namespace == namespace for k in self.registry.residents()):
            return True
        return any(
            i.in_store and i.key.kind is PageKind.MIND and i.key.namespace == namespace
            for i in self.store.infos()
        )


def _common_prefix(a: npt.NDArray[np.int32], b: npt.NDArray[np.int32]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
