"""Named built-in chat templates render exactly as llama.cpp's own tests expect.

`tests/test-chat-template.cpp` of the pinned llama.cpp lists template texts with the output
libllama's built-in formats must give for its conversation (`expected_output`, checked there
through `llama_chat_apply_template`). Each case is read from that file and rendered through
`BuiltinTemplate` (kvswap's `--no-jinja` path), and every name of libllama's list renders as
a named template (`--chat-template NAME`), as llama-server's `/apply-template` does.
"""

from __future__ import annotations

import re

import pytest

from kvswap.backend.chat_builtin import apply_builtin, builtin_template_names
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import InvalidMessagesError, TemplateRenderError
from tests.compat.source import require_llama_cpp_src

pytestmark = [pytest.mark.timeout(60)]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
_STRING = r'(?:u8|U8C\()?"((?:[^"\\]|\\.)*)"'
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], text)


def _cases() -> list[tuple[str, str, str, list[dict[str, str]]]]:
    """(name, template text, expected output, extra messages) of every test case."""
    src = (require_llama_cpp_src() / "tests" / "test-chat-template.cpp").read_text()
    cases = []
    for chunk in src.split("/* .name= */")[1:]:
        name = _unescape(re.match(r"\s*" + _STRING, chunk).group(1))  # type: ignore[union-attr]
        template = re.search(r"/\* \.template_str=? \*/\s*" + _STRING, chunk)
        expected = re.search(r"/\* \.expected_output=? \*/\s*" + _STRING, chunk)
        assert template is not None and expected is not None, name
        extra_src = re.search(r"/\* \.extra_conversation= \*/(.*)", chunk)  # one line
        extra = []
        if extra_src:
            for role, content in re.findall(_STRING + r"\s*,\s*" + _STRING, extra_src.group(1)):
                extra.append({"role": _unescape(role), "content": _unescape(content)})
        cases.append((name, _unescape(template.group(1)), _unescape(expected.group(1)), extra))
    return cases


def test_every_case_of_llama_cpps_chat_template_test_renders_as_expected() -> None:
    cases = _cases()
    assert len(cases) >= 30  # the pinned file has 36
    for name, template, expected, extra in cases:
        rendered = BuiltinTemplate(template, "", "", apply_builtin).render(CONVERSATION + extra)
        assert rendered == expected, name


def test_every_builtin_name_renders_as_a_named_template() -> None:
    names = builtin_template_names()
    assert {"chatml", "llama3", "command-r", "gemma", "mistral-v7", "phi4"} <= set(names)
    for name in names:
        assert BuiltinTemplate(name, "", "", apply_builtin).render(CONVERSATION[:2]), name


def test_command_r_by_name_is_llama_servers_apply_template_answer() -> None:
    # the pinned suite's test_apply_chat_template expects exactly this from llama-server
    messages = [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hi there"},
    ]
    assert BuiltinTemplate("command-r", "", "", apply_builtin).render(messages) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )


def test_text_parts_join_with_newlines_and_the_generation_prompt_is_optional() -> None:
    llama3 = BuiltinTemplate("llama3", "", "", apply_builtin)
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    out = llama3.render([{"role": "user", "content": parts}], add_generation_prompt=False)
    assert out == "<|start_header_id|>user<|end_header_id|>\n\nWh\nill<|eot_id|>"


def test_tools_unknown_formats_and_bad_messages_are_refused() -> None:
    llama3 = BuiltinTemplate("llama3", "", "", apply_builtin)
    tool = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(InvalidMessagesError, match="requires --jinja"):
        llama3.render(CONVERSATION, tools=[tool])
    with pytest.raises(InvalidMessagesError, match="must contain 'content'"):
        llama3.render([{"role": "user"}])
    unknown = BuiltinTemplate("INVALID TEMPLATE", "", "", apply_builtin)
    assert not unknown.supported()
    with pytest.raises(TemplateRenderError, match="not supported"):
        unknown.render(CONVERSATION)
