"""Resuming a mind taken over, on the CPU (`tiers.shared.resume.Resumer`): the tier's page
fetched into a buffer of our own, the fallbacks after a miss, and what the token log says,
against stand-ins for the store, the token log, the leases and the local copies (no Redis),
with a real page laid out by the page format.

Each test names the defect it would catch: a takeover restoring this replica's older copy
over the tier's newer page, a miss that fails the turn instead of falling back, a bad
generation's chunks reused by the next publication, the fetched buffer never freed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kvswap.core.errors import StoreFull
from kvswap.core.keys import PageKey, mind_key, namespace_of
from kvswap.core.page import PageGeometry, plan_layout, write_tokens
from kvswap.core.vocab import ResumeSource
from kvswap.engine.kv.pagestore import PageStore
from kvswap.tiers.shared.errors import Miss, MissReason, TierUnavailable
from kvswap.tiers.shared.health import TierHealth
from kvswap.tiers.shared.holdings import Held
from kvswap.tiers.shared.keys import MindKeys
from kvswap.tiers.shared.lease import Incarnation, Lease
from kvswap.tiers.shared.resume import Resumer
from kvswap.tiers.shared.store import Fetched
from kvswap.tiers.shared.token_log import LogRead

KEY = mind_key(namespace_of("k"), "alice")
GEOMETRY = PageGeometry("model", "f16", "f16", n_stream=1, n_ctx_slot=4096)
PAGE_TOKENS = np.arange(10, 16, dtype=np.int32)
LOG_TOKENS = np.arange(10, 18, dtype=np.int32)


def held(**fields: Any) -> Held:
    lease = Lease(MindKeys.of(KEY), Incarnation("a", "http://a:8080", "tok-a"), 4, 5000)
    return Held(KEY, lease, fields.pop("tokens", np.zeros(0, np.int32)), **fields)


@dataclass
class Manifest:
    n_tokens: int
    gen: int


@dataclass
class Store:
    """The tier: a manifest (or a miss) and a fetch (a page of PAGE_TOKENS, or a miss)."""

    manifest: Manifest | Miss = field(default_factory=lambda: Manifest(6, 9))
    miss: Miss | None = None
    fetched_into: list[int] = field(default_factory=list)

    def read_manifest(self, keys: MindKeys) -> Manifest | Miss:
        return self.manifest

    def fetch(self, keys: MindKeys, *, fingerprint: str, alloc: Any) -> Fetched | Miss:
        assert fingerprint == GEOMETRY.file_fingerprint()
        layout = plan_layout(len(PAGE_TOKENS), 64, GEOMETRY)
        page = alloc(layout.n_bytes)  # the resume's own buffer
        self.fetched_into.append(layout.n_bytes)
        if self.miss is not None:
            return self.miss
        write_tokens(page, layout, PAGE_TOKENS)
        page[layout.target.offset : layout.target.end] = b"\x07" * 64
        return Fetched(page, layout, self.manifest, layout.n_bytes, 0.25, 0.05)  # type: ignore[arg-type]


@dataclass
class TokenLog:
    away: bool = False

    def read_log(self, keys: MindKeys) -> LogRead:
        if self.away:
            raise TierUnavailable("token log read: connection refused")
        return LogRead(LOG_TOKENS, "t7", b"t7's chat record")


@dataclass
class Holdings:
    def update(self, record: Held, **changes: object) -> None:
        for name, value in changes.items():
            setattr(record, name, value)


@dataclass
class Local:
    has_copy: bool = False
    forgotten: list[PageKey] = field(default_factory=list)
    store: PageStore = field(default_factory=lambda: PageStore(1 << 20))

    def forget(self, key: PageKey) -> bool:
        self.forgotten.append(key)
        return True

    def has(self, key: PageKey) -> bool:
        return self.has_copy


@dataclass
class Parts:
    store: Store = field(default_factory=Store)
    log: TokenLog = field(default_factory=TokenLog)
    local: Local = field(default_factory=Local)
    health: TierHealth = field(default_factory=TierHealth)

    def resumer(self) -> Resumer:
        return Resumer(
            holdings=Holdings(),  # type: ignore[arg-type]
            store=self.store,  # type: ignore[arg-type]
            token_log=self.log,  # type: ignore[arg-type]
            local=self.local,  # type: ignore[arg-type]
            health=self.health,
        )


def test_a_mind_held_already_resumes_from_nothing() -> None:
    """Decision: a mind this replica holds needs no read at all: its turn just runs."""
    p = Parts(log=TokenLog(away=True))  # would fail if read
    record = held(resumed=True, tokens=LOG_TOKENS)
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.HELD and not out.taken_over
    assert out.state is None and list(out.tokens_known) == list(LOG_TOKENS)


def test_a_mind_the_tier_never_held_is_new() -> None:
    """Decision: a mind the tier has no manifest for starts from this replica's copies (a mind
    from before the cluster) or its prompt, counted as no takeover."""
    p = Parts(store=Store(manifest=Miss(MissReason.ABSENT, "no manifest")))
    record = held()
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.NEW and not out.taken_over
    assert record.resumed and record.turn_id_logged == "t7"
    assert p.local.forgotten == []


def test_a_takeover_restores_the_tiers_page_and_forgets_the_local_copies() -> None:
    """Defect caught: a takeover restoring this replica's older copy (a slot, RAM page or file
    from before another replica advanced the mind) instead of the tier's newer page."""
    p = Parts()
    record = held()
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.TIER and out.taken_over
    assert p.local.forgotten == [KEY]
    assert out.state is not None and list(out.state.tokens) == list(PAGE_TOKENS)
    assert bytes(out.state.target) == b"\x07" * 64
    assert list(out.page_tokens) == list(PAGE_TOKENS)
    assert list(out.tokens_known) == list(LOG_TOKENS) and out.last_turn == "t7"
    assert out.chat == b"t7's chat record"  # the next prompt continues the last answer
    assert (out.fetch_s, out.verify_s) == (0.25, 0.05)
    assert (record.n_published, record.published_gen, record.published_seq) == (6, 9, 0)
    assert not record.resumed  # audit A6: resumed once a turn ran on it, not before
    out.close()
    assert out.state is None


def test_a_fetched_page_is_charged_to_the_page_store_until_it_is_let_go() -> None:
    """Audit C4: takeover buffers were allocated outside the page store's ceiling, so eight
    concurrent takeovers of large minds could hold eight pages' worth of RAM uncounted; a
    store too full for the page now refuses the takeover with a typed 503 (StoreFull)."""
    p = Parts()
    out = p.resumer().resume(held(), GEOMETRY)
    assert p.local.store.charged_bytes == p.store.fetched_into[0] > 0
    out.close()
    assert p.local.store.charged_bytes == 0
    full = Parts(local=Local(store=PageStore(p.store.fetched_into[0] + 1)))
    blocker = full.local.store.reserve(KEY, 2)
    with pytest.raises(StoreFull):
        full.resumer().resume(held(), GEOMETRY)
    full.local.store.cancel(blocker)
    assert full.local.store.charged_bytes == 0


def test_a_corrupt_page_falls_back_and_the_next_publication_writes_whole() -> None:
    """Defect caught: a bad chunk failing the turn (instead of the local copy or a
    re-prefill), or the next delta publication reusing the bad generation's chunks."""
    p = Parts(store=Store(miss=Miss(MissReason.CHUNK_CORRUPT, "chunk 2: CRC-32", gen=9)))
    p.local.has_copy = True
    record = held()
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.LOCAL and out.taken_over
    assert out.miss == "chunk_corrupt" and out.state is None
    assert record.publish_whole and record.published_gen == 9
    assert p.local.forgotten == []  # its copy here is what the turn starts from


def test_a_page_of_another_model_is_re_prefilled_but_its_chunks_kept() -> None:
    """Decision: a fingerprint miss (another model or KV types) re-prefills from the prompt,
    and, the chunks being sound, the next publication may still reuse them."""
    p = Parts(store=Store(miss=Miss(MissReason.FINGERPRINT, "made with q8_0", gen=4)))
    record = held()
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.NONE and out.miss == "fingerprint"
    assert not record.publish_whole and record.published_gen == 4


def test_redis_away_during_a_resume_falls_back_and_is_counted() -> None:
    """Defect caught: an unreachable Redis mid-takeover failing the turn; its token log is
    then taken as unknown (behind: the next publication writes it whole)."""
    p = Parts(
        store=Store(miss=Miss(MissReason.UNAVAILABLE, "fetch: timeout")),
        log=TokenLog(away=True),
    )
    record = held()
    out = p.resumer().resume(record, GEOMETRY)
    assert out.source is ResumeSource.NONE and len(out.tokens_known) == 0
    assert record.log_behind and record.resumed
    assert not p.health.reachable and p.health.n_failures == 2
