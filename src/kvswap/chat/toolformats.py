"""How a model writes tool calls: the prompt adaptation, the grammar, the parser.

Two formats, chosen from the chat template:

- `HermesFormat`, for templates whose models write `<tool_call>{"name": ..., "arguments": ...}
  </tool_call>` (Qwen 2.5/3, Hermes 2/3 and their kin: the template source holds
  `<tool_call>`). The template renders the tools, the calls and the results itself. A forced
  choice (`required`, a named function) is a grammar from the first token; `auto` is a lazy
  grammar that takes over at `<tool_call>`.
- `GenericFormat`, for every other template (SmolLM2's ChatML knows no tools): the model answers
  in JSON, `{"tool_call": {"name", "arguments"}}` (`{"tool_calls": [...]}` with
  `parallel_tool_calls`) or `{"response": "..."}`, always under a grammar, as llama-server's
  former "generic" chat format. The system message lists the tools and asks for that JSON when
  the template cannot show tools, in the same words for every tool choice (the grammar alone
  holds a forced call, so a switch of choice keeps the conversation's prefix); past calls and results are written into the messages in the
  same JSON when the template cannot render them. The pinned llama-server answers such templates
  in plain text, even for `tool_choice: "required"`.

Each call's arguments follow the tool's `parameters` schema (`kvswap.grammar.schema`). Parsing
reads possibly unfinished output (`partial_json`) and returns the content and the calls seen
so far, growing monotonically. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from kvswap.chat.partial_json import JsonSyntaxError, Node, parse_value, skip_ws
from kvswap.chat.reasoning import partial_suffix
from kvswap.chat.tools import Tool, ToolChoice, ToolMode, arguments_object, callable_tools
from kvswap.grammar.gbnf import RuleSet, literal
from kvswap.grammar.schema import SchemaConverter


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as generated (a prefix while unfinished)


@dataclass(frozen=True)
class ToolGrammar:
    """The grammar for tool calls, and its trigger words when lazy (empty: from the start)."""

    gbnf: str
    trigger_words: tuple[str, ...] = ()


class ToolFormat(Protocol):
    name: str

    def adapt_messages(
        self,
        messages: list[dict[str, Any]],
        tools: tuple[Tool, ...],
        parallel: bool,
        template_caps: Any,
    ) -> list[dict[str, Any]]: ...

    def grammar(self, tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> ToolGrammar:
        """The grammar for this choice (`choice.mode` is not NONE)."""
        ...

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]: ...


def _call_rules(conv: SchemaConverter, tools: tuple[Tool, ...]) -> str:
    """A rule for `{"name": "<tool>", "arguments": <its parameters>}`, one alternative each."""
    alts = []
    for i, tool in enumerate(tools):
        args = conv.add(tool.parameters, f"tool{i}-arguments")
        body = (
            '"{" space "\\"name\\"" space ":" space '
            f'{literal(json.dumps(tool.name, ensure_ascii=False))} space "," space '
            f'"\\"arguments\\"" space ":" space {args} space "}}"'
        )
        alts.append(conv.rules.add(f"tool{i}-call", body))
    return conv.rules.add("tool-call", " | ".join(alts))


def _call_from(node: Node, text: str) -> ParsedCall | None:
    """A call object's name (once complete) and its arguments' text so far."""
    if node.kind != "object":
        return None
    name = node.get("name")
    if name is None or name.kind != "string" or not name.complete:
        return None
    args = node.get("arguments") or node.get("parameters")
    return ParsedCall(name.text, text[args.start : args.end] if args is not None else "")


def _tool_call_json(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", {})
    return {"name": fn.get("name", ""), "arguments": arguments_object(fn.get("arguments", ""))}


# ------------------------------------------------------------------------------------ generic


GENERIC_INSTRUCTION = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with "
    "`response` reply to the user's request"
)


class GenericFormat:
    """Tool calls as a JSON answer, for templates with no tool syntax (see the module doc)."""

    name = "generic"

    def adapt_messages(
        self,
        messages: list[dict[str, Any]],
        tools: tuple[Tool, ...],
        parallel: bool,
        template_caps: Any,
    ) -> list[dict[str, Any]]:
        out = []
        names_by_id: dict[str, str] = {}
        for msg in messages:
            msg = dict(msg)
            calls = msg.get("tool_calls") or []
            for call in calls:
                if call.get("id"):
                    names_by_id[call["id"]] = call.get("function", {}).get("name", "")
            if calls and not template_caps.supports_tool_calls:
                payload = [_tool_call_json(c) for c in calls]
                obj: dict[str, Any] = (
                    {"tool_call": payload[0]}
                    if len(payload) == 1 and not parallel
                    else {"tool_calls": payload}
                )
                msg["content"] = json.dumps(obj, ensure_ascii=False)
                del msg["tool_calls"]
            if msg.get("role") == "tool" and not template_caps.supports_tool_responses:
                response: dict[str, Any] = {}
                name = msg.get("name") or names_by_id.get(msg.get("tool_call_id") or "", "")
                if name:
                    response["tool"] = name
                response["content"] = msg.get("content", "")
                msg = {"role": "user", "content": json.dumps({"tool_response": response})}
            out.append(msg)
        # One instruction and every tool for any choice and output constraint: a forced call
        # (`required`, a named function), `none` and a response format are held by the grammar
        # alone, so switching them mid-conversation keeps the prompt, and the cached prefix.
        system = GENERIC_INSTRUCTION
        if parallel:
            system = system.replace("`tool_call`", "`tool_calls`")
        if not template_caps.supports_tools:
            listing = json.dumps(
                [t.as_openai()["function"] for t in tools],
                indent=2,
                ensure_ascii=False,
            )
            system = (
                "You can call any of the following tools to satisfy the user's requests:\n"
                f"{listing}\n\n{system}"
            )
        return _add_system(out, system)

    def grammar(self, tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> ToolGrammar:
        """Under NONE only the `response` alternative: the prompt is the one `auto` shows."""
        conv = SchemaConverter(RuleSet())
        alts = []
        if choice.mode is not ToolMode.NONE:
            call = _call_rules(conv, callable_tools(tools, choice))
            if parallel:
                calls = (
                    f'"\\"tool_calls\\"" space ":" space "[" space {call} '
                    f'( "," space {call} )* space "]"'
                )
            else:
                calls = f'"\\"tool_call\\"" space ":" space {call}'
            alts.append(conv.rules.add("tool-calls-kv", calls))
        if not choice.forces_call:
            string = conv.primitive("string")
            alts.append(conv.rules.add("response-kv", f'"\\"response\\"" space ":" space {string}'))
        conv.rules.set("root", f'"{{" space ( {" | ".join(alts)} ) space "}}"')
        return ToolGrammar(conv.rules.render())

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        try:
            node = parse_value(text, 0)
        except JsonSyntaxError:
            return text, []
        if node is None:
            return "", []
        if node.kind != "object":
            return text, []
        calls: list[ParsedCall] = []
        one = node.get("tool_call")
        many = node.get("tool_calls")
        for item in ([one] if one is not None else []) + (many.items if many else []):
            call = _call_from(item, text)
            if call is not None:
                calls.append(call)
        response = node.get("response")
        content = response.text if response is not None and response.kind == "string" else ""
        if final and not calls and response is None and node.complete:
            content = text  # valid JSON that is neither: show it as it is
        return content, calls


def _add_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Append `text` to the system message, or put a system message first."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        content = first.get("content") or ""
        if isinstance(content, list):
            first["content"] = [*content, {"type": "text", "text": text}]
        else:
            first["content"] = f"{content}\n\n{text}" if content else text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


# ------------------------------------------------------------------------------------- hermes

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


class HermesFormat:
    """`<tool_call>{json}</tool_call>` blocks, rendered by the template itself."""

    name = "hermes"

    def adapt_messages(
        self,
        messages: list[dict[str, Any]],
        tools: tuple[Tool, ...],
        parallel: bool,
        template_caps: Any,
    ) -> list[dict[str, Any]]:
        return messages

    def grammar(self, tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> ToolGrammar:
        conv = SchemaConverter(RuleSet())
        call = _call_rules(conv, callable_tools(tools, choice))
        block = conv.rules.add("tool-call-block", f'"{CALL_START}\\n" {call} "\\n{CALL_END}"')
        conv.rules.set("root", f'{block} ( "\\n" {block} )*' if parallel else block)
        triggers = () if choice.forces_call else (CALL_START,)
        return ToolGrammar(conv.rules.render(), triggers)

    def parse(self, text: str, final: bool) -> tuple[str, list[ParsedCall]]:
        first = text.find(CALL_START)
        if first < 0:
            held = 0 if final else partial_suffix(text, CALL_START)
            content = text[: len(text) - held]
            return (content if final else content.rstrip()), []
        content = text[:first].rstrip()
        calls: list[ParsedCall] = []
        pos = first
        while pos >= 0:
            try:
                node = parse_value(text, pos + len(CALL_START))
            except JsonSyntaxError:
                break
            if node is None:
                break
            call = _call_from(node, text)
            if call is not None:
                calls.append(call)
            if not node.complete:
                break
            after = skip_ws(text, node.end)
            if text.startswith(CALL_END, after):
                after += len(CALL_END)
            pos = text.find(CALL_START, after)
        return content, calls


# Templates that wrap a non-JSON syntax in <tool_call> (Qwen3-Coder and Qwen3.5's XML
# functions, GLM's argument tags, MiniMax's invokes) are not Hermes.
_NOT_HERMES = ("<function=", "<arg_key>", "<invoke")


def tool_format_for(template_source: str) -> ToolFormat:
    """The format a template's model uses for tool calls."""
    hermes = CALL_START in template_source and CALL_END in template_source
    if hermes and not any(marker in template_source for marker in _NOT_HERMES):
        return HermesFormat()
    return GenericFormat()
