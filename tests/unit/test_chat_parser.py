"""The chat output parser: partial JSON, reasoning blocks, tool-call formats, stream deltas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvswap.chat.message import ChatMsg, MsgDiff, ToolCall, compute_diffs
from kvswap.chat.parser import ChatParser, ParseSpec
from kvswap.chat.partial_json import JsonSyntaxError, parse_value
from kvswap.chat.reasoning import Reasoning, partial_suffix
from kvswap.chat.toolformats import GenericFormat, HermesFormat, tool_format_for

GENERIC = ParseSpec(tool_format=GenericFormat())
HERMES = ParseSpec(tool_format=HermesFormat(), reasoning=Reasoning())


def _ids() -> object:
    counter = iter(range(1000))
    return lambda: f"id{next(counter)}"


def rebuild(diffs: list[MsgDiff]) -> ChatMsg:
    """The message a client assembles from the deltas alone."""
    content = "".join(d.content_delta for d in diffs)
    reasoning = "".join(d.reasoning_delta for d in diffs)
    calls: dict[int, list[str]] = {}
    for d in diffs:
        if d.tool_index >= 0:
            entry = calls.setdefault(d.tool_index, ["", "", ""])
            if d.tool_name:
                entry[0], entry[2] = d.tool_name, d.tool_id
            entry[1] += d.arguments_delta
    return ChatMsg(
        content=content,
        reasoning_content=reasoning,
        tool_calls=tuple(ToolCall(n, a, i) for n, a, i in (calls[k] for k in sorted(calls))),
    )


def stream(spec: ParseSpec, pieces: list[str]) -> tuple[ChatMsg, list[MsgDiff]]:
    parser = ChatParser(spec, new_id=_ids())  # type: ignore[arg-type]
    diffs: list[MsgDiff] = []
    for piece in pieces:
        diffs += parser.feed(piece)
    diffs += parser.finish()
    return parser.msg, diffs


def whole(spec: ParseSpec, text: str) -> ChatMsg:
    return ChatParser(spec, new_id=_ids()).parse_all(text)  # type: ignore[arg-type]


OUTPUTS = [
    (
        GENERIC,
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Pa\\"ris", "n": [1, 2.5e3]}}}',
    ),
    (GENERIC, '{"response": "Hello \\u00e9 \\ud83d\\ude00 world\\n"}'),
    (
        GENERIC,
        '{\n  "tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": true}}]\n}',
    ),
    (
        HERMES,
        "<think>\nlet me think\n</think>\n\nSure. <tool_call>\n"
        '{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n'
        '{"name": "g", "arguments": {}}\n</tool_call>',
    ),
    (HERMES, "Just text <tool with a trailing space "),
    (ParseSpec(reasoning=Reasoning(opened=True)), "thinking...</think>\n\nanswer"),
    (ParseSpec(reasoning=Reasoning()), "no reasoning at all"),
    (ParseSpec(reasoning=Reasoning()), "<think>unfinished thought"),
]


@pytest.mark.parametrize(("spec", "text"), OUTPUTS)
def test_char_by_char_stream_rebuilds_the_whole_message(spec: ParseSpec, text: str) -> None:
    final, diffs = stream(spec, list(text))
    assert final == whole(spec, text)
    assert rebuild(diffs) == final


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking_gives_the_same_deltas_sum(data: st.DataObject) -> None:
    spec, text = data.draw(st.sampled_from(OUTPUTS))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    final, diffs = stream(spec, pieces)
    assert final == whole(spec, text)
    assert rebuild(diffs) == final


def test_generic_tool_call_arguments_are_the_generated_json_text() -> None:
    msg = whole(GENERIC, OUTPUTS[0][1])
    (call,) = msg.tool_calls
    assert call.name == "get_weather" and call.id == "id0"
    assert json.loads(call.arguments) == {"city": 'Pa"ris', "n": [1, 2500.0]}
    assert msg.content == ""


def test_generic_response_is_the_decoded_string() -> None:
    assert whole(GENERIC, OUTPUTS[1][1]).content == "Hello é 😀 world\n"


def test_hermes_splits_reasoning_content_and_calls() -> None:
    msg = whole(HERMES, OUTPUTS[3][1])
    assert msg.reasoning_content == "let me think"
    assert msg.content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [
        ("f", {"a": 1}),
        ("g", {}),
    ]


def test_hermes_holds_back_a_partial_marker_until_decided() -> None:
    parser = ChatParser(ParseSpec(tool_format=HermesFormat()))
    assert [d.content_delta for d in parser.feed("Hi <tool_")] == ["Hi"]
    assert [d.content_delta for d in parser.feed("box> ")] == [" <tool_box>"]


def test_an_unfinished_call_appears_once_its_name_is_complete() -> None:
    parser = ChatParser(GENERIC, new_id=_ids())  # type: ignore[arg-type]
    assert parser.feed('{"tool_call": {"name": "get_wea') == []
    (head,) = parser.feed('ther", "arguments": {"ci')
    assert (head.tool_index, head.tool_name, head.arguments_delta) == (0, "get_weather", '{"ci')
    (more,) = parser.feed('ty": "X"}}}')
    assert more.tool_name == "" and more.arguments_delta == 'ty": "X"}'


def test_reasoning_start_tag_is_held_back_while_it_may_still_come() -> None:
    r = Reasoning()
    assert r.split("  <thi", final=False) == ("", len("  <thi"))
    assert r.split("<think> a </thi", final=False) == ("a", len("<think> a </thi"))
    assert r.split("<think> a </think>rest", final=True) == ("a", len("<think> a </think>"))
    assert r.split("hello", final=False) == ("", 0)


def test_reasoning_detection_from_template_and_prompt() -> None:
    src = "{{ '<think>' }}...{{ '</think>' }}"
    assert Reasoning.detect(src, "<|assistant|>\n<think>\n") == Reasoning(opened=True)
    assert Reasoning.detect(src, "<|assistant|>\n") == Reasoning(opened=False)
    assert Reasoning.detect("no tags", "x") is None


def test_partial_suffix() -> None:
    assert partial_suffix("abc<tool", "<tool_call>") == 5
    assert partial_suffix("abc", "<tool_call>") == 0
    assert partial_suffix("<tool_call>", "<tool_call>") == 0  # whole words are not partial


def test_partial_json_spans_and_completeness() -> None:
    text = '{"a": [1, "x\\n"], "b": {"c": nul'
    node = parse_value(text, 0)
    assert node is not None and node.kind == "object" and not node.complete
    a = node.get("a")
    assert a is not None and a.complete and text[a.start : a.end] == '[1, "x\\n"]'
    assert a.items[1].text == "x\n"
    b = node.get("b")
    assert b is not None and not b.complete and text[b.start : b.end] == '{"c": nul'
    with pytest.raises(JsonSyntaxError):
        parse_value('{"a" 1}', 0)
    with pytest.raises(JsonSyntaxError):
        parse_value("[tru3]", 0)


def test_partial_string_never_ends_inside_an_escape() -> None:
    for cut in ("\\", "\\u00", "\\ud83d", "\\ud83d\\ude"):
        node = parse_value('"ab' + cut, 0)
        assert node is not None and node.text == "ab" and not node.complete


def test_diffs_refuse_a_snapshot_that_shrinks() -> None:
    from kvswap.chat.message import DiffError

    with pytest.raises(DiffError):
        compute_diffs(ChatMsg(content="abc"), ChatMsg(content="abd"))
    with pytest.raises(DiffError):
        compute_diffs(ChatMsg(tool_calls=(ToolCall("f", "{}"),)), ChatMsg())


def test_a_parser_that_stops_making_sense_keeps_what_it_sent() -> None:
    parser = ChatParser(ParseSpec(tool_format=HermesFormat()))
    parser.feed("text <tool_call>\n{")
    assert parser.msg.content == "text"
    # Content that would now contradict the stream is not sent.
    assert parser.feed("} oops") == [] or parser.msg.content.startswith("text")


def test_format_follows_the_template() -> None:
    assert isinstance(tool_format_for("... <tool_call>\\n{json}\\n</tool_call> ..."), HermesFormat)
    assert isinstance(tool_format_for("<tool_call><function=x>...</tool_call>"), GenericFormat)
    assert isinstance(tool_format_for("{{ messages }}"), GenericFormat)
