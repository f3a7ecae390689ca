"""A mind's text split back into the chat messages that render it (`text.transcript`), through
real chat templates (SmolLM2's, Qwen 2.5's, one that refuses a system message) in kvswap's
jinja sandbox. What the web page relies on: the messages render the mind's text again, so a
turn that adds a user message extends the mind instead of replacing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.text.template import ChatTemplate
from kvswap.text.transcript import Framing, Message, history

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's way: no system role (it raises), turns as <start_of_turn>.
NO_SYSTEM = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' "
    "+ m['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# A template that numbers its turns: no framing repeats, so none can be learned.
NUMBERED = (
    "{% for m in messages %}[{{ loop.index }}:{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[next:assistant]{% endif %}"
)


def _render(source: str):  # type: ignore[no-untyped-def]
    template = ChatTemplate(source, "<s>", "</s>")
    return lambda messages, gen: template.render(messages, add_generation_prompt=gen)


def _mind_text(source: str, messages: list[Message], answer: str) -> str:
    """What a mind holds after a chat turn: the prompt, then the answer's tokens (never its
    end-of-turn token)."""
    return _render(source)(messages, True) + answer


CONVERSATION: list[Message] = [
    {"role": "user", "content": "Hi, I am Carol.\nI keep bees."},
    {"role": "assistant", "content": "Hello Carol! How are the bees?"},
    {"role": "user", "content": "Busy. What do I keep?"},
]


@pytest.mark.parametrize(
    "source",
    [SMOLLM2, (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), NO_SYSTEM],
    ids=["smollm2", "qwen2.5", "no-system"],
)
def test_a_chat_minds_text_comes_back_as_its_messages(source: str) -> None:
    """Decision: the page shows a mind made through the API as the chat it is, and sending
    those messages with a new one renders the mind's text first (its tokens are kept)."""
    render = _render(source)
    text = _mind_text(source, CONVERSATION, "Bees, Carol.")
    messages = history(text, render)
    assert messages == [*CONVERSATION, {"role": "assistant", "content": "Bees, Carol."}]
    follow = render([*messages, {"role": "user", "content": "And honey?"}], True)
    assert follow.startswith(text)


def test_a_system_prompt_of_the_clients_own_is_kept_and_the_templates_default_left_out() -> None:
    """A client's own system prompt is part of the history; the one SmolLM2's template writes
    when there is none is the template's, so the page does not show it as the user's."""
    render = _render(SMOLLM2)
    own = [{"role": "system", "content": "Be brief."}, *CONVERSATION]
    assert history(_mind_text(SMOLLM2, own, "Bees."), render) == [
        *own,
        {"role": "assistant", "content": "Bees."},
    ]
    default = history(_mind_text(SMOLLM2, CONVERSATION, "Bees."), render)
    assert default is not None and default[0]["role"] == "user"


def test_text_that_is_no_chat_and_templates_without_a_framing_give_none() -> None:
    """A raw /completion prompt, a mind cut inside a user message and a template that frames
    each turn differently have no messages: the page then shows the text as it is."""
    render = _render(SMOLLM2)
    assert history("The bees of the river hum", render) is None
    cut = _render(SMOLLM2)(CONVERSATION, False)[:-20]  # inside the last user message
    assert history(cut, render) is None
    assert Framing.learn(_render(NUMBERED), system=False) is None
    assert history(_mind_text(NUMBERED, CONVERSATION, "x"), _render(NUMBERED)) is None


def test_the_framing_of_smollm2() -> None:
    assert Framing.learn(_render(SMOLLM2), system=True) == Framing(
        head="<|im_start|>system\n",
        system_user="<|im_end|>\n<|im_start|>user\n",
        user_assistant="<|im_end|>\n<|im_start|>assistant\n",
        assistant_user="<|im_end|>\n<|im_start|>user\n",
    )
