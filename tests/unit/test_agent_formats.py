"""Agent API shapes: chat messages and deltas with tool calls, Anthropic and Responses bodies
and streams, parsed back with the official clients' types."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types as at
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from kvswap.chat.blocks import BlockKind, BlockStream
from kvswap.chat.message import ChatMsg, MsgDiff, ToolCall
from kvswap.core.sampling import SamplingParams
from kvswap.core.types import Completion, GenerationRequest, StopType, Timings
from kvswap.server.anthropic import formats as fa
from kvswap.server.anthropic.cache import CacheMarks
from kvswap.server.openai import formats_responses as fr
from kvswap.server.openai.formats_chat import chat_diff_chunks, chat_final_msg, chat_finish_chunks
from kvswap.server.openai.formats_oai import OaiMeta

pytestmark = pytest.mark.timeout(30)

META = OaiMeta(id="chatcmpl-abc", model="m", created=1700000000, system_fingerprint="kvswap")
TIMINGS = Timings(cache_n=3, prompt_n=7, prompt_ms=10.0, predicted_n=5, predicted_ms=20.0)
MSG = ChatMsg(
    content="Let me check.",
    reasoning_content="The user wants weather.",
    tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', "abc"),),
)


def completion(stop: StopType = StopType.EOS, word: str = "") -> Completion:
    return Completion(
        req_id=1,
        id_slot=0,
        content="raw",
        tokens=(1, 2, 3, 4, 5),
        n_decoded=5,
        n_prompt_tokens=10,
        n_tokens_cached=15,
        stop_type=stop,
        stopping_word=word,
        timings=TIMINGS,
        seed=1,
        sampling=SamplingParams(),
        n_predict=-1,
    )


def diffs_of(msg: ChatMsg) -> list[MsgDiff]:
    out = [MsgDiff(reasoning_delta=msg.reasoning_content), MsgDiff(content_delta=msg.content)]
    for i, call in enumerate(msg.tool_calls):
        out.append(MsgDiff(tool_index=i, tool_id=call.id, tool_name=call.name, arguments_delta="{"))
        out.append(MsgDiff(tool_index=i, arguments_delta=call.arguments[1:]))
    return out


def test_chat_final_with_tool_calls_parses_as_openai() -> None:
    body = chat_final_msg(completion(), GenerationRequest(prompt_tokens=(1,)), META, MSG)
    parsed = ChatCompletion.model_validate(body)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.id == "abc" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert body["choices"][0]["message"]["reasoning_content"] == "The user wants weather."


def test_chat_content_is_null_beside_tool_calls_only() -> None:
    only_call = ChatMsg(tool_calls=MSG.tool_calls)
    body = chat_final_msg(completion(), GenerationRequest(prompt_tokens=(1,)), META, only_call)
    assert body["choices"][0]["message"]["content"] is None
    plain = chat_final_msg(
        completion(StopType.LIMIT),
        GenerationRequest(prompt_tokens=(1,)),
        META,
        ChatMsg(content="x"),
    )
    assert plain["choices"][0]["message"]["content"] == "x"
    assert plain["choices"][0]["finish_reason"] == "length"


def test_chat_stream_chunks_accumulate_to_the_message() -> None:
    chunks = chat_diff_chunks(diffs_of(MSG), META, first=True)
    chunks += chat_finish_chunks(completion(), META, MSG, include_usage=True)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    args = "".join(
        tc.function.arguments or ""
        for p in parsed
        for ch in p.choices
        for tc in ch.delta.tool_calls or []
        if tc.function
    )
    assert json.loads(args) == {"city": "Paris"}
    first_call = next(
        p.choices[0].delta.tool_calls[0]
        for p in parsed
        if p.choices and p.choices[0].delta.tool_calls
    )
    assert first_call.id == "abc" and first_call.type == "function"
    assert parsed[-2].choices[0].finish_reason == "tool_calls"
    assert parsed[-1].choices == [] and parsed[-1].usage is not None


def test_blocks_open_one_at_a_time_in_order() -> None:
    stream = BlockStream()
    events = stream.feed(diffs_of(MSG)) + stream.close()
    assert [(e.op, e.block.kind, e.block.position) for e in events if e.op != "delta"] == [
        ("open", BlockKind.REASONING, 0),
        ("close", BlockKind.REASONING, 0),
        ("open", BlockKind.TEXT, 1),
        ("close", BlockKind.TEXT, 1),
        ("open", BlockKind.TOOL, 2),
        ("close", BlockKind.TOOL, 2),
    ]
    assert events[-1].text == '{"city": "Paris"}'


def test_anthropic_message_and_stream_build_the_same_message() -> None:
    """The SDK reads the whole message and the stream alike, usage included: 3 read, 5
    created under a 5-minute breakpoint a mind keeps, 2 uncached (the cumulative
    message_delta repeats the input fields)."""
    c = completion()
    meta = fa.MessageMeta("msg_1", "m", CacheMarks(end_5m=8, kept=True))
    body = fa.message_json(c, MSG, meta)
    assert "timings" not in body  # Anthropic's shape has none unless asked (timings_per_token)
    whole = at.Message.model_validate(body)
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.stop_reason == "tool_use" and whole.usage.input_tokens == 2
    assert whole.usage.cache_read_input_tokens == 3
    assert whole.usage.cache_creation_input_tokens == 5
    assert whole.usage.cache_creation is not None
    assert whole.usage.cache_creation.ephemeral_5m_input_tokens == 5

    from anthropic.lib.streaming._messages import accumulate_event

    stream = BlockStream()
    events = [fa.message_start(meta, n_prompt_tokens=10, n_cached=3)]
    events += fa.block_events(stream.feed(diffs_of(MSG)) + stream.close())
    events += fa.message_end(c, MSG, meta)
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for ev in events:
        snapshot = accumulate_event(event=ev, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot.content[0].thinking == MSG.reasoning_content
    assert snapshot.content[1].text == MSG.content
    assert snapshot.content[2].input == {"city": "Paris"}
    assert snapshot.stop_reason == "tool_use"
    assert snapshot.usage.model_dump(include={"input_tokens", "cache_creation_input_tokens"}) == {
        "input_tokens": 2,
        "cache_creation_input_tokens": 5,
    }
    assert events[-1] == {"type": "message_stop"}
    assert fa.encode(events[-1]) == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def test_anthropic_stop_sequence_is_named() -> None:
    assert fa.stop_reason(completion(StopType.WORD, "END"), ChatMsg()) == ("stop_sequence", "END")
    assert fa.stop_reason(completion(StopType.LIMIT), ChatMsg()) == ("max_tokens", None)


def test_responses_body_and_stream() -> None:
    meta = fr.ResponseMeta(id="resp_1", model="m", created_at=1700000000)
    c = completion()
    body = fr.response_json(meta, status="completed", output=fr.output_items(MSG), c=c)
    parsed = Response.model_validate(body)
    assert [o.type for o in parsed.output] == ["reasoning", "message", "function_call"]
    assert parsed.output_text == "Let me check."
    assert body["output"][2]["call_id"] == "call_abc" and body["usage"]["input_tokens"] == 10

    events = fr.ResponseEvents(meta)
    stream = BlockStream()
    out = events.start() + events.blocks(stream.feed(diffs_of(MSG)) + stream.close())
    out += events.complete(c)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    types = [e["type"] for e in out]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert (
        types.count("response.output_item.added") == 3 == types.count("response.output_item.done")
    )
    final = out[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["reasoning", "message", "function_call"]
    assert final[1]["content"][0]["text"] == "Let me check."


def test_responses_length_limit_is_incomplete() -> None:
    meta = fr.ResponseMeta(id="resp_1", model="m", created_at=1)
    body = fr.response_json(meta, status="completed", output=[], c=completion(StopType.LIMIT))
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
