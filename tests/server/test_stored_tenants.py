"""Stored responses and conversations are their API key's own (a tiny model, `--api-key`):
another key gets a 404 on every response id and conversation route (a 400
`previous_response_not_found` when it chains on one, as for an unknown id), never a hint, and
nothing of the first key's text in any answer or in its /pages."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SECRET = "tangerine-harbour-7"
ARGS: dict[str, Any] = {"model": "m", "max_output_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    log = tmp_path_factory.mktemp("tenants") / "server.log"
    server = ServerProcess(
        ["-m", str(model), "-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "--api-key", "ka,kb"],
        log,
    )
    yield server
    server.stop()


def test_another_key_finds_nothing(keyed: ServerProcess) -> None:
    """Defects caught: a response or conversation id readable, deletable, cancellable,
    listable or continuable by another API key, or an answer that differs for another key's
    id and an unknown one (a hint that it exists)."""
    a, b = oai(keyed, "ka"), oai(keyed, "kb")
    first = a.responses.create(input=f"The password is {SECRET}.", **ARGS)
    conv = a.conversations.create(items=[{"role": "user", "content": f"Keep {SECRET} safe."}])
    item_id = a.conversations.items.list(conv.id).data[0].id
    answers: dict[bool, list[str]] = {True: [], False: []}  # theirs, unknown
    for theirs, rid in ((True, first.id), (False, "resp_unknown")):
        for call in _response_calls(b, rid):
            with pytest.raises(openai.NotFoundError) as err:
                call()
            answers[theirs].append(err.value.response.text.replace(rid, "ID"))
        with pytest.raises(openai.BadRequestError) as chained:
            b.responses.create(input="What is the password?", previous_response_id=rid, **ARGS)
        assert chained.value.code == "previous_response_not_found"
        answers[theirs].append(chained.value.response.text.replace(rid, "ID"))
    for theirs, cid in ((True, conv.id), (False, "conv_unknown")):
        for call in _conversation_calls(b, cid, item_id):
            with pytest.raises(openai.NotFoundError) as err:
                call()
            answers[theirs].append(err.value.response.text.replace(cid, "ID"))
    assert answers[True] == answers[False], "another key's id answers as an unknown one"
    assert not any(SECRET in body for body in answers[True])
    pages = keyed.client.get("/pages", headers={"Authorization": "Bearer kb"}).json()
    assert pages["stored"]["chains"] == [] and pages["stored"]["conversations"] == []
    assert SECRET not in str(pages)
    # The owner still has everything.
    assert a.responses.retrieve(first.id).id == first.id
    assert a.conversations.items.retrieve(item_id, conversation_id=conv.id).id == item_id


def _response_calls(b: openai.OpenAI, rid: str) -> list[Callable[[], object]]:
    return [
        lambda: b.responses.retrieve(rid),
        lambda: b.responses.delete(rid),
        lambda: b.responses.cancel(rid),
        lambda: b.responses.input_items.list(rid),
    ]


def _conversation_calls(b: openai.OpenAI, cid: str, item_id: str) -> list[Callable[[], object]]:
    return [
        lambda: b.conversations.retrieve(cid),
        lambda: b.conversations.update(cid, metadata={"k": "v"}),
        lambda: b.conversations.items.list(cid),
        lambda: b.conversations.items.create(cid, items=[{"role": "user", "content": "x"}]),
        lambda: b.conversations.items.retrieve(item_id, conversation_id=cid),
        lambda: b.conversations.items.delete(item_id, conversation_id=cid),
        lambda: b.responses.create(input="Tell me.", conversation=cid, **ARGS),
        lambda: b.conversations.delete(cid),
    ]


def _two_keys(tmp_path_factory: pytest.TempPathFactory, *args: str) -> ServerProcess:
    """A tiny model's server of one slot for keys ka and kb, with `args`."""
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    log = tmp_path_factory.mktemp("keys") / "server.log"
    return ServerProcess(
        ["-m", str(model), "-np", "1", "-t", "1", "-tb", "1", "--api-key", "ka,kb", *args], log
    )


def test_one_keys_flood_leaves_another_keys_records_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Audit F2, F3, F6 through the API (`--state-bytes 200000`): A stores a response and a
    conversation; B adds conversations of 100 KB items far past the budget. A's response and
    conversation answer whole, B's oldest conversation is gone, a conversation larger than B's
    share is refused naming --state-bytes, and each key's /pages shows its own bytes and share
    only. Defect caught: B's single stored turn deleted A's records (one LRU for all keys)."""
    server = _two_keys(tmp_path_factory, "-c", "2048", "--state-bytes", "200000")
    try:
        a, b = oai(server, "ka"), oai(server, "kb")
        kept = a.responses.create(input="Remember the tide.", **ARGS)
        conv = a.conversations.create(items=[{"role": "user", "content": "Keep this."}])
        a_pages = server.client.get("/pages", headers={"Authorization": "Bearer ka"}).json()
        big = [{"role": "user", "content": "x" * 10_000}] * 8
        b_convs = [b.conversations.create(items=big) for _ in range(6)]
        with pytest.raises(openai.BadRequestError) as refused:
            b.conversations.items.create(b_convs[-1].id, items=big)
        assert "--state-bytes" in refused.value.message and refused.value.param == "items"
        b.responses.create(input="One stored turn.", **ARGS)
        assert a.responses.retrieve(kept.id).id == kept.id
        assert [i.id for i in a.conversations.items.list(conv.id).data]
        with pytest.raises(openai.NotFoundError):
            b.conversations.retrieve(b_convs[0].id)
        b.conversations.retrieve(b_convs[-1].id)
        a_after = server.client.get("/pages", headers={"Authorization": "Bearer ka"}).json()
        b_after = server.client.get("/pages", headers={"Authorization": "Bearer kb"}).json()
        assert a_after["stored"]["n_bytes"] == a_pages["stored"]["n_bytes"]
        assert a_after["stored"]["budget_bytes"] == b_after["stored"]["budget_bytes"] == 100_000
        assert a_after["stored"]["n_bytes"] + b_after["stored"]["n_bytes"] <= 200_000
    finally:
        server.stop()


def test_background_responses_are_capped_per_key(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Audit F5 (`--state-background-per-key 2`): a key with two background responses queued
    or running gets a 429 naming the flag for a third (none recorded), while another key still
    starts its own; once one of the first key's is cancelled, it may start another. Defect
    caught: 60 queued runs of one key, costing it no connection, delayed every key."""
    server = _two_keys(tmp_path_factory, "-c", "4096", "--state-background-per-key", "2")
    long: dict[str, Any] = {
        "model": "m",
        "max_output_tokens": 3000,
        "background": True,
        "input": "Count.",
        "extra_body": {"ignore_eos": True},  # a run that lasts: 3,000 tokens
    }
    try:
        a = openai.OpenAI(base_url=server.url + "/v1", api_key="ka", max_retries=0)
        b = openai.OpenAI(base_url=server.url + "/v1", api_key="kb", max_retries=0)
        first, _ = b.responses.create(**long), b.responses.create(**long)
        with pytest.raises(openai.RateLimitError) as refused:
            b.responses.create(**long)
        assert "--state-background-per-key" in refused.value.message
        assert refused.value.response.headers["retry-after"] == "1"
        theirs = a.responses.create(**long)
        b.responses.cancel(first.id)
        deadline = time.monotonic() + 30
        while True:
            try:
                later = b.responses.create(**long)
                break
            except openai.RateLimitError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        for client, rid in ((b, later.id), (a, theirs.id), (b, _.id)):
            client.responses.cancel(rid)
    finally:
        server.stop()
