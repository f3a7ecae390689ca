"""`--reasoning off` ends the prompt as llama-server's does, on llama.cpp's own templates.

The expected endings are those of llama.cpp's `tests/unit/test_template.py` (the pinned
suite): a template that forces `<think>` open gets it closed, Qwen3 renders its own empty
block with enable_thinking false, Command R7B gets an empty thinking block.
"""

from __future__ import annotations

import pytest

from kvswap.chat.reasoning import close_thinking
from kvswap.text.template import ChatTemplate
from tests.compat.source import require_llama_cpp_src

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize(
    ("name", "thinking", "ending"),
    [
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True, "<think>\n"),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", False, "<think>\n</think>"),
        ("Qwen-Qwen3-0.6B", None, "<|im_start|>assistant\n"),
        ("Qwen-Qwen3-0.6B", False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ("Qwen-QwQ-32B", None, "<|im_start|>assistant\n<think>\n"),
        ("Qwen-QwQ-32B", False, "<|im_start|>assistant\n<think>\n</think>"),
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
            False,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
    ],
)
def test_prompt_endings(name: str, thinking: bool | None, ending: str) -> None:
    path = require_llama_cpp_src() / "models" / "templates" / f"{name}.jinja"
    template = ChatTemplate(path.read_text(encoding="utf-8"), "<s>", "</s>")
    messages = [{"role": "user", "content": "What is today?"}]
    prompt = template.render(messages, enable_thinking=thinking)
    if thinking is False:
        prompt = close_thinking(template.source, prompt)
    assert prompt.endswith(ending), prompt[-80:]


def test_a_template_that_does_not_think_is_left_alone() -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}<|im_start|>assistant\n"
    assert close_thinking(chatml, "x<|im_start|>assistant\n") == "x<|im_start|>assistant\n"
