"""A chat request made ready to run: prompt, grammar, and how to read the answer.

Owns what llama-server's `oaicompat_chat_params_parse` and `common_chat_templates_apply` decide
for a chat body, shared by /v1/chat/completions, /v1/messages and /v1/responses: the tools and
tool choice (`kvswap.chat.tools`), the tool-call format of the template
(`kvswap.chat.toolformats`), the messages adapted to it and rendered by the chat template, the
grammar (tool calls, `response_format`/`json_schema`, or the request's `grammar`, checked with
libllama here), the reasoning split (`reasoning_format`), and the `ParseSpec` each choice's
parser uses. Typed 400s for what cannot be honoured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvswap.chat.parser import ParseSpec
from kvswap.chat.reasoning import REASONING_FORMATS, Reasoning, close_thinking
from kvswap.chat.toolformats import ToolFormat, tool_format_for
from kvswap.chat.tools import ToolChoice, ToolError, ToolMode, parse_tool_choice, parse_tools
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.grammar import SchemaError
from kvswap.grammar.gbnf import regex_escape
from kvswap.server.requests.constraints import (
    Constraint,
    GrammarSource,
    check_constraint,
    response_format_schema,
    schema_grammar,
)
from kvswap.server.requests.continuation import split_continuation
from kvswap.server.requests.params import chat_messages
from kvswap.server.requests.schemas import ChatCompletionRequest
from kvswap.server.state import ServerState
from kvswap.text.messages import InvalidMessagesError
from kvswap.text.template import TemplateError

DEFAULT_REASONING_FORMAT = "auto"  # llama-server's --reasoning-format default


@dataclass(frozen=True)
class ChatPlan:
    """Everything a chat route needs beyond the body's sampling fields."""

    prompt: str
    constraint: Constraint | None
    spec: ParseSpec
    tool_format: str  # "generic", "hermes", or "" without tools
    reasoning_format: str


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def _reasoning_format(body: ChatCompletionRequest) -> str:
    fmt = body.reasoning_format or DEFAULT_REASONING_FORMAT
    if fmt not in REASONING_FORMATS:
        raise _invalid(f"Unknown reasoning format: {fmt}")
    return fmt


def plan_chat(state: ServerState, body: ChatCompletionRequest) -> ChatPlan:
    """Decide prompt, grammar and parsing for a chat body (typed 400s on bad inputs)."""
    try:
        tools = parse_tools(body.tools)
        choice = parse_tool_choice(body.tool_choice, tools) if tools or body.tool_choice else None
    except ToolError as err:
        raise _invalid(str(err)) from err
    choice = choice or ToolChoice(ToolMode.NONE)
    calling = bool(tools) and choice.mode is not ToolMode.NONE
    if calling and body.grammar:
        raise _invalid("Cannot use custom grammar constraints with tools.")
    schema = body.json_schema
    if schema is None:
        schema = response_format_schema(body.response_format)
    if schema is not None and choice.forces_call:
        raise _invalid(f"Cannot use response_format with tool_choice {choice.mode.value!r}")
    template = state.template
    fmt: ToolFormat | None = tool_format_for(template.source) if tools else None
    parallel = (
        body.parallel_tool_calls
        if body.parallel_tool_calls is not None
        else fmt is not None and fmt.name == "hermes"
    )
    # A response format wins over optional tool calls, as llama-server's autoparser.
    calling = calling and schema is None
    # tool_choice "none" shows the tools as "auto" does (llama-server renders them either way),
    # so a switch between the two keeps the prompt and the conversation's cache; a template
    # with no tool syntax is then held to the JSON reply, without its call alternative.
    answering = (
        choice.mode is ToolMode.NONE
        and fmt is not None
        and fmt.name == "generic"
        and schema is None
        and not body.grammar
    )
    messages = chat_messages(body)
    if fmt is not None:
        shown = ToolChoice(ToolMode.AUTO) if answering else choice
        messages = fmt.adapt_messages(
            messages,
            tools,
            shown if calling or answering else ToolChoice(ToolMode.NONE),
            parallel,
            template.caps,
        )
    prompt = _render(state, body, messages, [t.as_openai() for t in tools] or None)

    reasoning_format = _reasoning_format(body)
    reasoning = Reasoning.detect(template.source, prompt) if reasoning_format != "none" else None
    constraint: Constraint | None = None
    if (calling or answering) and fmt is not None:
        try:
            tool_grammar = fmt.grammar(tools, choice, parallel)
        except SchemaError as err:
            raise _invalid(f'"tools": a function\'s parameters: {err}') from err
        constraint = Constraint(
            _allow_reasoning(tool_grammar.gbnf, reasoning, lazy=bool(tool_grammar.trigger_words)),
            GrammarSource.TOOL_CALLS,
            tuple(regex_escape(w) for w in tool_grammar.trigger_words),
        )
    elif schema is not None:
        constraint = Constraint(
            _allow_reasoning(schema_grammar(schema), reasoning, lazy=False),
            GrammarSource.OUTPUT_FORMAT,
        )
    elif body.grammar:
        constraint = Constraint(body.grammar, GrammarSource.USER)
    if constraint is not None:
        check_constraint(state.vocab, constraint)
    streamed_legacy = reasoning_format == "deepseek-legacy" and bool(body.stream)
    spec = ParseSpec(
        tool_format=fmt if calling or answering else None,
        reasoning=None if streamed_legacy else reasoning,
        reasoning_in_content=reasoning_format == "deepseek-legacy",
    )
    return ChatPlan(prompt, constraint, spec, fmt.name if fmt else "", reasoning_format)


def _allow_reasoning(gbnf: str, reasoning: Reasoning | None, *, lazy: bool) -> str:
    """A forced grammar still lets a thinking template think first (a lazy one waits anyway)."""
    if reasoning is None or lazy:
        return gbnf
    return reasoning.allow_in_grammar(gbnf)


def _render(
    state: ServerState,
    body: ChatCompletionRequest,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> str:
    """The chat template applied to the messages (typed 400 on bad messages)."""
    # --chat-template-kwargs are the defaults; the request's own keys win (llama-server).
    kwargs = {k: json.loads(v) for k, v in state.config.model.chat_template_kwargs}
    kwargs.update(body.chat_template_kwargs or {})
    effort = body.reasoning_effort
    if effort == "none":
        kwargs["enable_thinking"] = False
    elif effort:
        kwargs["reasoning_effort"] = effort
    cont = split_continuation(
        messages,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        prefill_assistant=state.config.model.prefill_assistant,
    )
    reasoning = state.config.model.reasoning  # --reasoning: on, off or auto (the template's)
    try:
        prompt = state.template.render(
            cont.messages,
            add_generation_prompt=cont.add_generation_prompt,
            tools=tools,
            chat_template_kwargs=kwargs,
            enable_thinking=None if reasoning == "auto" else reasoning == "on",
        )
        if reasoning == "off" and cont.add_generation_prompt and not cont.suffix:
            prompt = close_thinking(state.template.source, prompt)
        return prompt + cont.suffix
    except (InvalidMessagesError, TemplateError) as err:
        raise _invalid(str(err)) from err
