"""A chat request made ready to run: prompt, grammar, and how to read the answer.

Owns what llama-server's `oaicompat_chat_params_parse` and `common_chat_templates_apply` decide
for a chat body, shared by /v1/chat/completions, /v1/messages and /v1/responses: the tools and
tool choice (`kvswap.chat.tools`), the tool-call format of the template
(`kvswap.chat.toolformats`), the messages adapted to it and rendered by the chat template, the
grammar (tool calls, `response_format`/`json_schema`, or the request's `grammar`, checked with
libllama here), the reasoning split (`reasoning_format`), and the `ParseSpec` each choice's
parser uses. Typed 400s for what cannot be honoured.

`prepare_chat` is the one preparation of a chat body (plan, render, tokenize, engine requests)
and `count_chat_tokens` the one token count, for every chat route and its count route.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvswap.chat.parser import ChatParser, ParseSpec
from kvswap.chat.reasoning import REASONING_FORMATS, Reasoning, close_thinking
from kvswap.chat.toolformats import ToolFormat, tool_format_for
from kvswap.chat.tools import (
    Tool,
    ToolChoice,
    ToolError,
    ToolMode,
    parse_tool_choice,
    parse_tools,
)
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PageKey
from kvswap.core.types import GenerationRequest
from kvswap.grammar import SchemaError
from kvswap.grammar.gbnf import regex_escape
from kvswap.minds.histories import LastTurn
from kvswap.minds.names import side_mind
from kvswap.server.requests.constraints import (
    Constraint,
    GrammarSource,
    check_constraint,
    response_format_schema,
    schema_grammar,
)
from kvswap.server.requests.continuation import split_continuation
from kvswap.server.requests.jobs import generation_requests, prompt_tokens
from kvswap.server.requests.resent import (
    continued,
    side_digest,
    side_request,
    system_digest,
    turn_mark,
)
from kvswap.server.requests.schemas import MEDIA_PART_TYPES, ChatCompletionRequest, ChatMessage
from kvswap.server.requests.serving import Serving
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
    # The messages and tools as the template saw them, and how many messages the tool format
    # put before the body's first (a system message listing the tools): `prefix_length`.
    shown: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    n_front: int = 0
    # How the conversation's earlier answers are read: tool calls parsed whenever the body
    # lists tools, whatever this request's tool choice (an earlier one may have called).
    history_spec: ParseSpec | None = None


def _invalid(message: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message)


def _reasoning_format(body: ChatCompletionRequest) -> str:
    fmt = body.reasoning_format or DEFAULT_REASONING_FORMAT
    if fmt not in REASONING_FORMATS:
        raise _invalid(f"Unknown reasoning format: {fmt}")
    return fmt


@dataclass(frozen=True)
class _Shape:
    """What a chat body asks of the template: its tools, the call format, the messages as the
    template sees them (adapted to the format)."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    fmt: ToolFormat | None
    parallel: bool
    schema: dict[str, Any] | None
    calling: bool  # the answer may (or must) call a tool
    answering: bool  # "none" on a format with no tool syntax: held to the JSON reply
    messages: list[dict[str, Any]]
    n_front: int  # messages the tool format put before the body's first (a tools system one)


def _shape(state: Serving, body: ChatCompletionRequest) -> _Shape:
    tools, choice = _tools(body)
    calling = bool(tools) and choice.mode is not ToolMode.NONE
    if calling and body.grammar:
        raise _invalid("Cannot use custom grammar constraints with tools.")
    schema = body.json_schema
    if schema is None:
        schema = response_format_schema(body.response_format)
    if schema is not None and choice.forces_call:
        raise _invalid(f"Cannot use response_format with tool_choice {choice.mode.value!r}")
    fmt: ToolFormat | None = tool_format_for(state.template.source) if tools else None
    parallel = (
        body.parallel_tool_calls
        if body.parallel_tool_calls is not None
        else fmt is not None and fmt.name == "hermes"
    )
    # A response format wins over optional tool calls, as llama-server's autoparser.
    calling = calling and schema is None
    # Under tool_choice "none" a template with no tool syntax is held to the JSON reply the
    # prompt asks for, without its call alternative.
    answering = (
        choice.mode is ToolMode.NONE
        and fmt is not None
        and fmt.name == "generic"
        and schema is None
        and not body.grammar
    )
    messages = given = chat_messages(body)
    if fmt is not None:
        # The tools shown alike for every choice and output constraint (a grammar holds them):
        # switching between auto, required, a named function, none or a response format keeps
        # the prompt, and the conversation's cached prefix.
        messages = fmt.adapt_messages(messages, tools, parallel, state.template.caps)
    n_front = len(messages) - len(given)
    return _Shape(tools, choice, fmt, parallel, schema, calling, answering, messages, n_front)


def plan_chat(state: Serving, body: ChatCompletionRequest) -> ChatPlan:
    """Decide prompt, grammar and parsing for a chat body (typed 400s on bad inputs)."""
    shape = _shape(state, body)
    tools, choice, fmt, messages = shape.tools, shape.choice, shape.fmt, shape.messages
    listed = [t.as_openai() for t in tools] or None
    prompt = _render(state, body, messages, listed)
    reasoning_format = _reasoning_format(body)
    template = state.template
    reasoning = Reasoning.detect(template.source, prompt) if reasoning_format != "none" else None
    tool_calls = fmt if (shape.calling or shape.answering) and fmt is not None else None
    constraint = _constraint(
        body, tool_calls, tools, choice, shape.parallel, shape.schema, reasoning
    )
    if constraint is not None:
        check_constraint(state.vocab, constraint)
    streamed_legacy = reasoning_format == "deepseek-legacy" and bool(body.stream)
    spec = ParseSpec(
        tool_format=tool_calls,
        reasoning=None if streamed_legacy else reasoning,
        reasoning_in_content=reasoning_format == "deepseek-legacy",
    )
    name = fmt.name if fmt else ""
    history_spec = replace(spec, tool_format=fmt)
    return ChatPlan(
        prompt,
        constraint,
        spec,
        name,
        reasoning_format,
        messages,
        listed,
        shape.n_front,
        history_spec,
    )


def render_history(state: Serving, body: ChatCompletionRequest) -> str:
    """A chat body's messages rendered as history: as `plan_chat` would show them, with no
    generation prompt and nothing continued (the last message is closed as the template
    closes it). The stored conversations derive the glue of a new turn from it."""
    shape = _shape(state, body)
    tools = [t.as_openai() for t in shape.tools] or None
    try:
        return state.template.render(
            shape.messages,
            add_generation_prompt=False,
            tools=tools,
            chat_template_kwargs=_template_kwargs(state, body),
            enable_thinking=_thinking(state),
        )
    except (InvalidMessagesError, TemplateError) as err:
        raise _invalid(str(err)) from err


def _tools(body: ChatCompletionRequest) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The body's tools and tool choice ("none" when it gives neither)."""
    try:
        tools = parse_tools(body.tools)
        choice = parse_tool_choice(body.tool_choice, tools) if tools or body.tool_choice else None
    except ToolError as err:
        raise _invalid(str(err)) from err
    return tools, choice or ToolChoice(ToolMode.NONE)


def _constraint(
    body: ChatCompletionRequest,
    tool_calls: ToolFormat | None,
    tools: tuple[Tool, ...],
    choice: ToolChoice,
    parallel: bool,
    schema: dict[str, Any] | None,
    reasoning: Reasoning | None,
) -> Constraint | None:
    """The grammar the answer runs under: the tool calls' (lazy when the format has trigger
    words), else the output schema's, else the body's own `grammar`; None: free text."""
    if tool_calls is not None:
        try:
            tool_grammar = tool_calls.grammar(tools, choice, parallel)
        except SchemaError as err:
            raise _invalid(f'"tools": a function\'s parameters: {err}') from err
        return Constraint(
            _allow_reasoning(tool_grammar.gbnf, reasoning, lazy=bool(tool_grammar.trigger_words)),
            GrammarSource.TOOL_CALLS,
            tuple(regex_escape(w) for w in tool_grammar.trigger_words),
        )
    if schema is not None:
        return Constraint(
            _allow_reasoning(schema_grammar(schema), reasoning, lazy=False),
            GrammarSource.OUTPUT_FORMAT,
        )
    if body.grammar:
        return Constraint(body.grammar, GrammarSource.USER)
    return None


@dataclass(frozen=True)
class ChatJob:
    """A chat body made ready to run: its plan and its engine requests."""

    body: ChatCompletionRequest
    plan: ChatPlan
    requests: list[GenerationRequest]
    # A side request on a session's key (its requests run without the session's mind): the
    # mind of its own it may run on instead (`Turn.hold_side`).
    side: PageKey | None = None


def prepare_chat(
    state: Serving,
    body: ChatCompletionRequest,
    mind: PageKey | None,
    last: LastTurn | None = None,
    *,
    by_session: bool = False,
) -> ChatJob:
    """Plan, render, tokenize and build the engine requests of a chat body, under `mind` (the
    mind the route holds): /v1/chat/completions, /v1/messages and /v1/responses alike. `last`:
    the mind's last turn, which a body re-sending the conversation continues
    (`requests.resent`); the request carries its own mark for the next turn. `by_session`:
    only a session key named the mind, so another conversation on the key runs without it
    (`requests.resent.side_request`), the job naming the side mind it may hold instead."""
    plan = plan_chat(state, body)
    tokens = continued(
        state,
        body,
        plan.prompt,
        last,
        lambda b: render_history(state, b),
        lambda text: [ChatParser(s).parse_all(text) for s in _answer_specs(plan)],
    )
    prompt = tokens if tokens is not None else prompt_tokens(state, plan.prompt)
    side, opening = None, system_digest(body.messages)
    if mind is not None and by_session and tokens is None and side_request(prompt, opening, last):
        side, mind = side_mind(mind, side_digest(body.messages)), None
    requests = generation_requests(state, body, [prompt], plan.constraint, mind=mind)
    if mind is not None and len(requests) == 1:
        requests = [replace(requests[0], turn_mark=turn_mark(body, plan.prompt, opening))]
    return ChatJob(body, plan, requests, side)


def _answer_specs(plan: ChatPlan) -> list[ParseSpec]:
    """How an earlier answer may have been read: as this request reads its own, and with the
    body's tools parsed when this request's choice parses none."""
    specs = [plan.spec]
    if plan.history_spec is not None and plan.history_spec != plan.spec:
        specs.append(plan.history_spec)
    return specs


def prefix_length(
    state: Serving,
    body: ChatCompletionRequest,
    plan: ChatPlan,
    n_messages: int,
    prompt: Sequence[int],
) -> int:
    """How many leading tokens of `prompt` (the body's rendered prompt) the body's first
    `n_messages` messages render to, with the tools and what the tool format put before them:
    where a prompt-cache breakpoint at the end of those messages lies. A template that cannot
    render the shorter conversation places it at the prompt's end."""
    shown = plan.shown[: plan.n_front + n_messages]
    part = body.model_copy(update={"add_generation_prompt": False})
    try:
        text = _render(state, part, shown, plan.tools)
    except KvswapError:
        return len(prompt)
    tokens = prompt_tokens(state, text)
    n = min(len(tokens), len(prompt))
    diff = np.flatnonzero(np.asarray(tokens[:n]) != np.asarray(prompt[:n]))
    return int(diff[0]) if len(diff) else n


def count_chat_tokens(state: Serving, body: ChatCompletionRequest) -> int:
    """The prompt tokens of a chat body, rendered as it would run (the routes' token counts,
    llama-server's `handle_count_tokens`)."""
    return len(prompt_tokens(state, plan_chat(state, body).prompt))


def _allow_reasoning(gbnf: str, reasoning: Reasoning | None, *, lazy: bool) -> str:
    """A forced grammar still lets a thinking template think first (a lazy one waits anyway)."""
    if reasoning is None or lazy:
        return gbnf
    return reasoning.allow_in_grammar(gbnf)


def _render(
    state: Serving,
    body: ChatCompletionRequest,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> str:
    """The chat template applied to the messages (typed 400 on bad messages)."""
    cont = split_continuation(
        messages,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        prefill_assistant=state.config.model.prefill_assistant,
    )
    try:
        prompt = state.template.render(
            cont.messages,
            add_generation_prompt=cont.add_generation_prompt,
            tools=tools,
            chat_template_kwargs=_template_kwargs(state, body),
            enable_thinking=_thinking(state),
        )
        if _thinking(state) is False and cont.add_generation_prompt and not cont.suffix:
            prompt = close_thinking(state.template.source, prompt)
        return prompt + cont.suffix
    except (InvalidMessagesError, TemplateError) as err:
        raise _invalid(str(err)) from err


def _template_kwargs(state: Serving, body: ChatCompletionRequest) -> dict[str, Any]:
    # --chat-template-kwargs are the defaults; the request's own keys win (llama-server).
    kwargs = _default_kwargs(state)
    kwargs.update(body.chat_template_kwargs or {})
    effort = body.reasoning_effort
    if effort == "none":
        kwargs["enable_thinking"] = False
    elif effort:
        kwargs["reasoning_effort"] = effort
    return kwargs


def _default_kwargs(state: Serving) -> dict[str, Any]:
    return {k: json.loads(v) for k, v in state.config.model.chat_template_kwargs}


def _thinking(state: Serving) -> bool | None:
    """--reasoning: on, off, or auto (None: the template's own default)."""
    reasoning = state.config.model.reasoning
    return None if reasoning == "auto" else reasoning == "on"


def render_plain(
    state: Serving, messages: list[dict[str, str]], add_generation_prompt: bool
) -> str:
    """Plain messages rendered as a chat request that sets nothing of its own renders them
    (the server's template defaults): what `text.transcript` learns a mind's framing from."""
    return state.template.render(
        messages,
        add_generation_prompt=add_generation_prompt,
        chat_template_kwargs=_default_kwargs(state),
        enable_thinking=_thinking(state),
    )


def chat_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as the chat template sees them (`common_chat_msg::to_json_oaicompat`).

    Content is a string, or a list of `{"type": "text", "text"}` parts; a null content becomes
    "". Media parts are a typed 501 (kvswap has no multimodal support).
    """
    return [_template_message(msg) for msg in body.messages]


def _template_message(msg: ChatMessage) -> dict[str, Any]:
    content: str | list[dict[str, str]]
    if isinstance(msg.content, list):
        for part in msg.content:
            if part.type in MEDIA_PART_TYPES:
                raise KvswapError(
                    ErrorKind.NOT_SUPPORTED, f"{part.type} input is not supported by this server"
                )
        content = [{"type": "text", "text": part.text or ""} for part in msg.content]
    else:
        content = msg.content or ""
    out: dict[str, Any] = {"role": msg.role, "content": content}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
    if msg.name:
        out["name"] = msg.name
    if msg.tool_call_id:
        out["tool_call_id"] = msg.tool_call_id
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments_text(call.function.arguments),
                },
                **({"id": call.id} if call.id else {}),
            }
            for call in msg.tool_calls
        ]
    return out


def _arguments_text(arguments: str | dict[str, Any] | None) -> str:
    # llama-server keeps a string as is and serialises anything else compactly.
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
