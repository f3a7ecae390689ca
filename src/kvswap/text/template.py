"""Chat templates (Hugging Face jinja, as stored in GGUF metadata) rendered as llama-server does.

Owns `ChatTemplate`, the template errors, and the BOS/EOS edge helpers; the message and tool
validation that llama-server applies before rendering lives in `text.messages`. Rendering runs in jinja2's `ImmutableSandboxedEnvironment` configured as Hugging
Face's `apply_chat_template` (trim_blocks, lstrip_blocks, loopcontrols, `{% generation %}`,
`tojson` with ensure_ascii=False, `raise_exception`, `strftime_now`), with llama-server's context
(common/chat.cpp, `common_chat_template_direct_apply_impl`): messages, bos_token, eos_token,
enable_thinking, tools, datetime, date_string, then `chat_template_kwargs` merged on top, then
add_generation_prompt.

Messages are first reshaped as llama-server reshapes them (`common_chat_msgs_parse_oaicompat`,
`common_chat_msg::to_json_oaicompat`): content is always a string ("" for null), text parts are
joined with newlines unless the template only renders typed content, role "developer" becomes
"system", and a system message is merged into the next one when the template ignores the system
role. The template's capabilities are probed once, at construction.

Safe to call from any thread (no libllama, no shared mutable state); it does not tokenize: the
caller tokenizes the result with special-token parsing (see `strip_leading_bos`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvswap.text.messages import (
    InvalidMessagesError,
    as_string_content,
    as_typed_content,
    fold_late_system,
    merge_system_into_next,
    normalize_messages,
    normalize_tools,
)

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
"""llama-server's fallback when the model has no template (`CHATML_TEMPLATE_SRC`)."""


class TemplateError(Exception):
    """The chat template could not be compiled or rendered."""


class TemplateSyntaxError(TemplateError):
    """The template source does not compile."""


class TemplateRenderError(TemplateError):
    """Rendering failed (undefined value, type error, sandbox violation, ...)."""


class TemplateRaisedError(TemplateRenderError):
    """The template called `raise_exception(message)`: it refuses these inputs."""

    def __init__(self, message: str) -> None:
        super().__init__(f"Jinja Exception: {message}")
        self.template_message = message


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    """What the template does with its inputs, found by rendering probes (llama.cpp jinja/caps)."""

    supports_string_content: bool
    """Renders `content` given as a string."""
    supports_typed_content: bool
    """Renders `content` given as a list of typed parts (used only when strings are not)."""
    supports_system_role: bool
    """Renders a system message's content (else it is merged into the next message)."""
    supports_tools: bool
    """Renders the `tools` list."""
    supports_thinking: bool
    """Output depends on `enable_thinking` (llama-server's default for it)."""
    supports_tool_calls: bool = False
    """Renders an assistant message's `tool_calls`."""
    supports_tool_responses: bool = False
    """Renders a `tool` message's content."""
    supports_object_arguments: bool = False
    """Wants tool-call arguments as an object (it JSON-encodes them itself)."""
    supports_late_system: bool = True
    """Renders a system message after a user message in place (else it is folded into the
    message before it: `messages.fold_late_system`)."""


def strip_leading_bos(text: str, bos_token: str) -> tuple[str, bool]:
    """Remove the BOS text the template emitted; return (text, whether it was there).

    llama-server tokenizes the prompt with add_special=True and parse_special=True; when the
    vocabulary adds BOS itself (`llama_vocab_get_add_bos`) it strips the template's leading BOS
    first, so the prompt has exactly one. `ChatTemplate(add_bos=True)` does this in `render`.
    """
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :], True
    return text, False


def strip_trailing_eos(text: str, eos_token: str) -> tuple[str, bool]:
    """Remove a trailing EOS text (llama-server does when the vocabulary adds EOS itself)."""
    if eos_token and text.endswith(eos_token):
        return text[: len(text) - len(eos_token)], True
    return text, False


# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# The jinja2 environment, as transformers' chat template utilities build it.


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for HF's training masks;
    for inference it renders its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API declares a class attribute

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's `tojson`: plain `json.dumps` (no HTML escaping, non-ASCII kept by default)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: object) -> NoReturn:
    raise TemplateRaisedError(str(message))


class _ConcatUndefined(jinja2.Undefined):
    """llama.cpp's jinja engine: a string `+` an undefined value is that string (templates such
    as firefunction-v2 add a variable llama-server never sets); anything else still fails."""

    def __add__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], str):
            return args[0]
        return self._fail_with_undefined_error(*args, **kwargs)

    __radd__ = __add__


def _new_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, loopcontrols],
        undefined=_ConcatUndefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


_PROBE_MARKER = "<<kvswap-probe-8d1f>>"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_MARKER,
        "description": "Tool description",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
    },
}


_PROBE_ARGS = '{"code": "kvswap-probe"}'


def _probe_call(arguments: object) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "id": "call_1",
                "function": {"name": _PROBE_MARKER, "arguments": arguments},
            }
        ],
    }


def _object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call whose JSON-object arguments are an object (llama-server's
    `func_args_not_string`, for templates that encode arguments themselves)."""
    fn = call.get("function", {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return call
        if isinstance(parsed, dict):
            return {**call, "function": {**fn, "arguments": parsed}}
    return call


def _probe_caps(*, string: bool, typed: bool) -> TemplateCaps:
    """Caps assumed while probing: only the content shape matters to `_prepare`."""
    return TemplateCaps(
        supports_string_content=string,
        supports_typed_content=typed,
        supports_system_role=True,
        supports_tools=False,
        supports_thinking=False,
    )


class ChatTemplate:
    """One compiled chat template with its tokens and probed capabilities.

    `add_bos`/`add_eos`: the vocabulary adds BOS/EOS itself when tokenizing, so `render` strips
    the template's own leading BOS / trailing EOS text (as llama-server). `clock` gives the time
    for `strftime_now`, `datetime` and `date_string` (local time by default).
    """

    def __init__(
        self,
        source: str,
        bos_token: str,
        eos_token: str,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self._clock = clock
        # GPT-OSS templates give "developer" its own meaning; llama-server maps it elsewhere.
        self._maps_developer_role = "<|channel|>" not in source
        try:
            self._template = _new_environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateSyntaxError(f"chat template line {e.lineno}: {e.message}") from e
        except Exception as e:  # a template is untrusted input: any compile failure is its fault
            raise TemplateSyntaxError(f"chat template does not compile: {e}") from e
        self.caps = self._probe_caps()

    def render(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        tools: object = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        enable_thinking: bool | None = None,
        **extra: Any,
    ) -> str:
        """Validate, reshape and render `messages`; return the prompt text.

        `tools`: OpenAI tools (None or empty: `tools` is none in the template).
        `chat_template_kwargs`: merged over the context, as llama-server (they may override
        anything but `add_generation_prompt=True`); a boolean `enable_thinking` among them sets
        `enable_thinking`. `enable_thinking`: None means llama-server's default with reasoning
        "auto", i.e. `caps.supports_thinking`. `extra`: more context variables, merged last.
        Raises `InvalidMessagesError` for bad inputs and `TemplateError` when rendering fails.
        """
        kwargs = dict(chat_template_kwargs or {})
        thinking = self.caps.supports_thinking if enable_thinking is None else enable_thinking
        kwarg_thinking = kwargs.get("enable_thinking")
        if isinstance(kwarg_thinking, bool):
            thinking = kwarg_thinking
        elif isinstance(kwarg_thinking, str):
            raise InvalidMessagesError(
                'invalid type for "enable_thinking" (expected boolean, got string)'
            )
        prepared = self._prepare(normalize_messages(messages), self.caps)
        context = self._context(
            prepared,
            tools=normalize_tools(tools),
            enable_thinking=thinking,
            add_generation_prompt=add_generation_prompt,
            overrides={**kwargs, **extra},
        )
        text = self._render(context)
        if self.add_bos:
            text, _ = strip_leading_bos(text, self.bos_token)
        if self.add_eos:
            text, _ = strip_trailing_eos(text, self.eos_token)
        return text

    def _prepare(self, messages: list[dict[str, Any]], caps: TemplateCaps) -> list[dict[str, Any]]:
        only_typed = caps.supports_typed_content and not caps.supports_string_content
        convert = as_typed_content if only_typed else as_string_content
        out = []
        for message in messages:
            message = {**message, "content": convert(message["content"])}
            if self._maps_developer_role and message["role"] == "developer":
                message["role"] = "system"
            if caps.supports_object_arguments and "tool_calls" in message:
                message["tool_calls"] = [_object_arguments(c) for c in message["tool_calls"]]
            out.append(message)
        if not caps.supports_late_system:
            out = fold_late_system(out)
        if not caps.supports_system_role:
            out = merge_system_into_next(out)
        return out

    def _context(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        enable_thinking: bool,
        add_generation_prompt: bool,
        overrides: Mapping[str, Any],
    ) -> dict[str, Any]:
        now = self._clock()
        context: dict[str, Any] = {
            "strftime_now": now.strftime,
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "enable_thinking": enable_thinking,
            "tools": tools,
            "datetime": now.strftime("%b %d %Y"),
            "date_string": now.strftime("%d %b %Y"),
        }
        context.update(overrides)
        if add_generation_prompt:
            context["add_generation_prompt"] = True
        context.setdefault("add_generation_prompt", False)
        # llama-server's reasoning aliases (jinja/caps.cpp): set first, explicit keys win.
        aliases: dict[str, Any] = {}
        preserve = context.get("preserve_reasoning")
        if isinstance(preserve, bool):
            aliases["preserve_thinking"] = preserve
            for key in ("clear_thinking", "truncate_history_thinking", "drop_thinking"):
                aliases[key] = not preserve
        effort = context.get("reasoning_effort")
        if isinstance(effort, str) and effort:
            aliases["reasoning_strength"] = effort
        return {**aliases, **context}

    def _render(self, context: Mapping[str, Any]) -> str:
        try:
            return self._template.render(context)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateRenderError(f"chat template failed: {e}") from e
        except Exception as e:  # untrusted template code: every failure is a render error
            raise TemplateRenderError(f"chat template failed: {type(e).__name__}: {e}") from e

    def _probe(
        self,
        messages: list[dict[str, Any]],
        caps: TemplateCaps,
        *,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool = False,
    ) -> str | None:
        """Render fixed inputs; None when the template refuses them (that is the answer)."""
        try:
            context = self._context(
                self._prepare(messages, caps),
                tools=tools,
                enable_thinking=enable_thinking,
                add_generation_prompt=True,
                overrides={},
            )
            return self._render(context)
        except TemplateError:
            return None

    def _probe_caps(self) -> TemplateCaps:
        # Probes mirror llama.cpp's common/jinja/caps.cpp, judged on the output instead of on
        # value-access statistics.
        caps = _probe_caps(string=True, typed=False)
        user = {"role": "user", "content": _PROBE_MARKER}
        as_string = self._probe([user], caps)
        string_ok = as_string is not None and _PROBE_MARKER in as_string
        typed_ok = False
        if not string_ok:
            as_typed = self._probe([user], _probe_caps(string=False, typed=True))
            typed_ok = as_typed is not None and _PROBE_MARKER in as_typed
        caps = _probe_caps(string=string_ok or not typed_ok, typed=typed_ok)
        hello = {"role": "user", "content": "User message"}
        with_system = self._probe([{"role": "system", "content": _PROBE_MARKER}, hello], caps)
        system_ok = with_system is not None and _PROBE_MARKER in with_system
        with_tools = self._probe([hello], caps, tools=[_PROBE_TOOL])
        tools_ok = with_tools is not None and _PROBE_MARKER in with_tools
        thinking_on = self._probe([hello], caps, enable_thinking=True)
        thinking_off = self._probe([hello], caps, enable_thinking=False)
        thinking_ok = thinking_on is not None and thinking_on != thinking_off
        as_text = self._probe([hello, _probe_call(_PROBE_ARGS)], caps)
        as_object = self._probe([hello, _probe_call(json.loads(_PROBE_ARGS))], caps)
        # A template that JSON-encodes the arguments shows the text version escaped.
        object_args = as_object is not None and (as_text is None or '\\"code\\"' in as_text)
        with_call = as_object if object_args else as_text
        calls_ok = with_call is not None and _PROBE_MARKER in with_call
        late = self._probe([hello, {"role": "system", "content": _PROBE_MARKER}, hello], caps)
        late_ok = system_ok and late is not None and _PROBE_MARKER in late
        response = {"role": "tool", "tool_call_id": "call_1", "content": _PROBE_MARKER + "-result"}
        call = _probe_call(json.loads(_PROBE_ARGS) if object_args else _PROBE_ARGS)
        with_response = self._probe([hello, call, response], caps)
        responses_ok = with_response is not None and _PROBE_MARKER + "-result" in with_response
        return TemplateCaps(
            supports_string_content=caps.supports_string_content,
            supports_typed_content=typed_ok,
            supports_system_role=system_ok,
            supports_tools=tools_ok,
            supports_thinking=thinking_ok,
            supports_tool_calls=calls_ok,
            supports_tool_responses=responses_ok,
            supports_object_arguments=object_args,
            supports_late_system=late_ok,
        )
