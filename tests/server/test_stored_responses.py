"""Stored responses and conversations through the official `openai` client: every method of
`client.responses` (create, retrieve, delete, cancel, input_items, input_tokens) and of
`client.conversations` (and its items), each raw answer validated with the SDK's own types,
and the errors OpenAI words (an unknown id, both `conversation` and `previous_response_id`, a
`store: false` id)."""

from __future__ import annotations

import time
from typing import Any

import openai
import pytest
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
)
from openai.types.responses import Response, ResponseItemList
from openai.types.responses.input_token_count_response import InputTokenCountResponse
from pydantic import TypeAdapter

from tests.server.agent_util import oai
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

ARGS: dict[str, Any] = {"model": "m", "max_output_tokens": 8, "temperature": 0}


def _typed(raw: Any, kind: Any) -> Any:
    """A raw SDK answer validated with the SDK's own type (strict shapes, not just parsed)."""
    return TypeAdapter(kind).validate_python(raw.http_response.json())


def test_every_response_method_through_the_sdk(agent_server: ServerProcess) -> None:
    """Decision: OpenAI's Responses state surface, in OpenAI's shapes: a client written for
    OpenAI chains, lists, counts and deletes against kvswap unchanged."""
    client = oai(agent_server)
    raw = client.responses.with_raw_response.create(input="Say hi.", **ARGS)
    first = _typed(raw, Response)
    assert first.status in ("completed", "incomplete") and first.id.startswith("resp_")
    assert first.model_extra and first.model_extra["continuation"]["mind"].startswith("chain-")
    got = _typed(client.responses.with_raw_response.retrieve(first.id), Response)
    assert got.id == first.id and got.output_text == first.output_text
    second = client.responses.create(input="Again.", previous_response_id=first.id, **ARGS)
    assert second.previous_response_id == first.id
    assert (
        second.model_extra
        and second.model_extra["continuation"]["mind"] == first.model_extra["continuation"]["mind"]
    )
    items = _typed(client.responses.input_items.with_raw_response.list(second.id), ResponseItemList)
    # The items the response was made from, newest first: its input, then the first turn's.
    roles = [getattr(i, "role", None) for i in items.data]
    assert roles == ["user", "assistant", "user"] and not items.has_more
    ascending = [i.id for i in client.responses.input_items.list(second.id, order="asc", limit=1)]
    assert ascending == [i.id for i in reversed(items.data)], "cursor paging, oldest first"
    count = client.responses.input_tokens.with_raw_response.count(
        model="m", input="More.", previous_response_id=second.id
    )
    n = _typed(count, InputTokenCountResponse).input_tokens
    assert second.usage is not None and n > second.usage.total_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    third = client.responses.create(input="Go on.", previous_response_id=second.id, **ARGS)
    assert third.status in ("completed", "incomplete"), "a deleted ancestor breaks nothing"


def test_errors_as_openai_words_them(agent_server: ServerProcess) -> None:
    """Typed errors, never a 500: each names the parameter at fault as OpenAI does, and
    `previous_response_not_found` is OpenAI's code (clients retry on it)."""
    client = oai(agent_server)
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(input="x", previous_response_id="resp_nope", **ARGS)
    assert unknown.value.code == "previous_response_not_found"
    assert unknown.value.param == "previous_response_id"
    assert "Previous response with id 'resp_nope' not found." in unknown.value.message
    kept = client.responses.create(input="x", **ARGS)
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(
            input="x", previous_response_id=kept.id, conversation="conv_x", **ARGS
        )
    assert "Mutually exclusive parameters" in both.value.message
    unstored = client.responses.create(input="x", store=False, **ARGS)
    assert unstored.model_extra is not None and unstored.model_extra.get("store") is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(input="x", previous_response_id=unstored.id, **ARGS)
    for call in (
        lambda: client.responses.retrieve("resp_nope"),
        lambda: client.responses.delete("resp_nope"),
        lambda: client.responses.cancel("resp_nope"),
        lambda: client.responses.input_items.list("resp_nope"),
        lambda: client.conversations.retrieve("conv_nope"),
        lambda: client.responses.create(input="x", conversation="conv_nope", **ARGS),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as limit:
        client.responses.input_items.list(kept.id, limit=101)
    assert limit.value.param == "limit"
    with pytest.raises(openai.BadRequestError) as not_bg:
        client.responses.cancel(kept.id)
    assert "background" in not_bg.value.message


def test_response_metadata_is_held_to_openais_limits(agent_server: ServerProcess) -> None:
    """`metadata` on POST /v1/responses is held to OpenAI's limits (16 string pairs, 64-char
    keys, 512-char values), a 400 naming `metadata`, before any inference or storage (audit
    F7: a 2 MB value was stored and echoed); metadata within them is kept and echoed."""
    client = oai(agent_server)
    for bad in (
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"nested": {"b": 1}},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(input="x", metadata=bad, **ARGS)  # type: ignore[arg-type]
        assert refused.value.param == "metadata", bad
    kept = client.responses.create(input="x", metadata={"k" * 64: "v" * 512}, **ARGS)
    assert kept.metadata == {"k" * 64: "v" * 512}
    assert client.responses.retrieve(kept.id).metadata == {"k" * 64: "v" * 512}


def test_every_conversation_method_through_the_sdk(agent_server: ServerProcess) -> None:
    """The Conversations API with OpenAI's limits; a response made in a conversation appends
    its input and output, and its next turn continues the conversation's mind."""
    client = oai(agent_server)
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(items=[{"role": "user", "content": "x"}] * 21)
    with pytest.raises(openai.BadRequestError):
        client.conversations.create(metadata={f"k{i}": "v" for i in range(17)})
    raw = client.conversations.with_raw_response.create(
        items=[{"role": "user", "content": "I like tea."}], metadata={"topic": "drinks"}
    )
    conv = _typed(raw, Conversation)
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "drinks"}
    assert _typed(client.conversations.with_raw_response.retrieve(conv.id), Conversation) == conv
    updated = client.conversations.update(conv.id, metadata={"topic": "tea"})
    assert updated.metadata == {"topic": "tea"}
    added = _typed(
        client.conversations.items.with_raw_response.create(
            conv.id, items=[{"role": "user", "content": "Hello."}]
        ),
        ConversationItemList,
    )
    first = client.responses.create(input="What do I like?", conversation=conv.id, **ARGS)
    assert first.conversation is not None and first.conversation.id == conv.id
    second = client.responses.create(input="Sure?", conversation=conv.id, **ARGS)
    assert second.model_extra and second.model_extra["continuation"]["mode"] == "incremental"
    listed = list(client.conversations.items.list(conv.id, order="asc", limit=2))
    assert [getattr(i, "role", None) for i in listed] == [
        "user", "user", "user", "assistant", "user", "assistant",
    ]  # fmt: skip
    item = client.conversations.items.with_raw_response.retrieve(
        added.first_id, conversation_id=conv.id
    )
    assert _typed(item, ConversationItem).id == added.first_id
    after = client.conversations.items.delete(added.first_id, conversation_id=conv.id)
    assert after.id == conv.id
    # A covered item deleted: the next turn renders the conversation anew, and says so.
    third = client.responses.create(input="Again?", conversation=conv.id, **ARGS)
    assert third.model_extra and third.model_extra["continuation"]["mode"] == "rendered"
    assert "deleted" in third.model_extra["continuation"]["reason"]
    gone = _typed(
        client.conversations.with_raw_response.delete(conv.id), ConversationDeletedResource
    )
    assert gone.deleted and gone.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conv.id)


def test_background_response_replayed_and_cancelled(agent_server: ServerProcess) -> None:
    """`background: true` answers at once; its stream is replayed from a sequence number
    (live while it runs); a cancel ends a running one `cancelled`, kept for GET."""
    client = oai(agent_server)
    queued = client.responses.create(input="Count to ten.", background=True, **ARGS)
    assert queued.status in ("queued", "in_progress") and queued.background
    events = list(client.responses.retrieve(queued.id, stream=True, starting_after=1))
    assert events and events[0].sequence_number == 2
    assert events[-1].type in ("response.completed", "response.incomplete")
    done = client.responses.retrieve(queued.id)
    assert done.status == events[-1].response.status and done.output_text
    long = client.responses.create(
        input="Count to a thousand.", background=True, model="m", max_output_tokens=2000
    )
    deadline = time.monotonic() + 60
    while client.responses.retrieve(long.id).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
