"""libllama's built-in chat templates: the named formats of `src/llama-chat.cpp`.

Owns the two libllama calls behind llama-server's non-jinja chat path
(`common_chat_templates_apply_legacy`): `llama_chat_builtin_templates` (the names: "chatml",
"llama3", "command-r", ...) and `llama_chat_apply_template`, which renders (role, content)
messages in a named format, or in the format it detects from a template's text. Rendering here
is rendering by llama.cpp's own code, so a named template is exactly llama-server's.

Pure functions of their arguments (no model, no context): safe on any thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

from kvswap.backend.bindings import llama_cpp


@cache
def builtin_template_names() -> tuple[str, ...]:
    """Every name libllama renders by itself, in its order."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return tuple(name.decode() for name in names if name is not None)


def apply_builtin(
    template: str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool
) -> str | None:
    """`messages` rendered by libllama in the format `template` names or looks like; None
    when libllama knows no such format."""
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the encoded strings must outlive the calls
    for i, (role, content) in enumerate(messages):
        role_b, content_b = role.encode(), content.encode()
        keep += [role_b, content_b]
        chat[i].role, chat[i].content = role_b, content_b
    tmpl = template.encode()
    size = max(64, sum(len(b) for b in keep) * 5 // 4)  # llama-server's first guess
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(
            tmpl, chat, len(messages), add_generation_prompt, buf, size
        )
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    raise AssertionError("llama_chat_apply_template grew its output twice")
