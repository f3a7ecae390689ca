"""Continuing the final message: assistant prefill and `continue_final_message`, as llama-server.

Owns `split_continuation`: which message the model continues, and the text appended after the
generation prompt. llama-server (`oaicompat_chat_params_parse`, `common_chat_templates_apply`):
- a conversation ending with an assistant message is continued (prefill, on by default;
  `--no-prefill-assistant` turns it off); two assistant messages at the end are refused;
- `continue_final_message` (true, "content" or "reasoning_content") asks for it explicitly,
  and excludes `add_generation_prompt: true` (checked in `schemas`);
- the last message is taken out, the others are rendered with the generation prompt, and the
  message's content (text parts joined by a blank line) follows; "reasoning_content", or an
  automatic continuation of a message holding only reasoning, continues that instead;
- an assistant message with tool calls cannot be continued.

kvswap appends the reasoning text right after the generation prompt; llama-server's
autoparser also re-inserts a thinking template's open/close markers around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvswap.core.errors import ErrorKind, KvswapError


@dataclass(frozen=True)
class Continuation:
    messages: list[dict[str, Any]]  # what the template renders
    add_generation_prompt: bool
    suffix: str  # appended to the rendered prompt ("" when nothing is continued)


def _content_text(content: object) -> str:
    if isinstance(content, list):
        return "\n\n".join(str(part.get("text", "")) for part in content)
    return str(content or "")


def split_continuation(
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool | None,
    continue_final_message: bool | str | None,
    prefill_assistant: bool,
) -> Continuation:
    """The rendering plan of a chat body's messages (typed 400 for what llama-server refuses)."""
    mode = continue_final_message
    agp = True if add_generation_prompt is None else add_generation_prompt
    if not mode and prefill_assistant and messages and messages[-1]["role"] == "assistant":
        if len(messages) >= 2 and messages[-2]["role"] == "assistant":
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                "Cannot have 2 or more assistant messages at the end of the list.",
            )
        mode = True
    if not mode or not messages:
        return Continuation(messages, agp, "")
    last = messages[-1]
    if last["role"] == "assistant" and last.get("tool_calls"):
        raise KvswapError(
            ErrorKind.INVALID_REQUEST,
            "Cannot continue an assistant message that contains tool calls.",
        )
    content = _content_text(last.get("content"))
    reasoning = str(last.get("reasoning_content") or "")
    if mode == "reasoning_content" or (mode is True and reasoning and not content):
        suffix = reasoning
    else:
        suffix = content
    return Continuation(messages[:-1], True, suffix)
