"""Named built-in chat templates (llama.cpp's `src/llama-chat.cpp` list), and `--no-jinja`.

Owns `BuiltinTemplate`: a chat template rendered by libllama's `llama_chat_apply_template`
(injected as `apply`, from `kvswap.backend.chat_builtin`), the way llama-server renders without
jinja (`common_chat_templates_apply_legacy`): messages reduced to (role, text) pairs, text parts
joined with newlines, the format named ("llama3", "command-r", ...) or detected from a template's
text. kvswap uses it:
- for `--chat-template NAME` with a built-in NAME other than "chatml", with or without jinja
  (llama-server's jinja path would render the name itself as the prompt text);
- for every template under `--no-jinja`, as llama-server.

Without jinja there are no tools (llama-server: "tools param requires --jinja flag"), no
thinking switch and no template kwargs. `render` has `ChatTemplate.render`'s signature and
error types, so the chat routes take either. Safe on any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvswap.text.messages import InvalidMessagesError, join_text_parts, normalize_messages
from kvswap.text.template import (
    TemplateCaps,
    TemplateRenderError,
    strip_leading_bos,
    strip_trailing_eos,
)

# (template name or text, (role, content) pairs, add_generation_prompt) -> text, None: unknown.
ApplyBuiltin = Callable[[str, Sequence[tuple[str, str]], bool], str | None]

# Without jinja, templates take plain text and render whatever system message they are given.
BUILTIN_CAPS = TemplateCaps(
    supports_string_content=True,
    supports_typed_content=False,
    supports_system_role=True,
    supports_tools=False,
    supports_thinking=False,
)


class BuiltinTemplate:
    """A named (or detected) built-in format, rendered by libllama; see the module docstring."""

    def __init__(
        self,
        source: str,
        bos_token: str,
        eos_token: str,
        apply: ApplyBuiltin,
        *,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        self.source = source  # the name, or the template text libllama detects a format in
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.caps = BUILTIN_CAPS
        self._apply = apply

    def supported(self) -> bool:
        """libllama knows this format (llama-server's `common_chat_verify_template`)."""
        return self._apply(self.source, [("user", "test")], True) is not None

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
        """The prompt text; InvalidMessagesError for tools or bad messages, TemplateRenderError
        when libllama knows no such format."""
        if tools:
            raise InvalidMessagesError("tools param requires --jinja flag")
        pairs = []
        for message in normalize_messages(messages):
            content = message["content"]
            text = content if isinstance(content, str) else join_text_parts(content)
            pairs.append((str(message["role"]), text))
        out = self._apply(self.source, pairs, add_generation_prompt)
        if out is None:
            raise TemplateRenderError("this custom template is not supported, try using --jinja")
        if self.add_bos:
            out, _ = strip_leading_bos(out, self.bos_token)
        if self.add_eos:
            out, _ = strip_trailing_eos(out, self.eos_token)
        return out
