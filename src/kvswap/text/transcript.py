"""A mind's history as chat messages: its text split back into the messages that rendered it.

A mind is tokens. The web page shows it as a chat, and the page's next turn must render those
same tokens again, or it replaces the mind's history instead of extending it. `Framing.learn`
renders a probe conversation (placeholder contents) through the server's chat template and
keeps what the template writes around the messages: the text before the first one, and between
a system message and a user one, a user message and an assistant one, an assistant one and a
user one. `Framing.parse` splits a mind's text with them; `history` keeps the result only when
those messages render back to the mind's text, so a turn that sends them with a new user
message extends the mind (a system prompt the template adds by itself is left out).

Only templates that frame every round alike are learned (the probe renders two rounds and they
must agree); a template that cannot, and text that does not follow the framing (a raw
/completion prompt, a mind cut mid-message), give None: the caller shows the text as it is.
Tool calls and tool results come back as the text the template made of them, inside the
neighbouring message. Pure: the caller's `render` applies the template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvswap.text.messages import InvalidMessagesError
from kvswap.text.template import TemplateError

Message = dict[str, str]
# (messages, add_generation_prompt) -> the template's text for them.
Render = Callable[[list[Message], bool], str]

_PROBE = "KVSWAPPROBE"  # contents no template changes: letters only


def _probe(*roles: str) -> list[Message]:
    return [{"role": role, "content": f"{_PROBE}{i}{_PROBE}"} for i, role in enumerate(roles)]


def _between(text: str, messages: list[Message]) -> list[str] | None:
    """The text around each message's content, in order (len(messages) + 1 pieces); None
    when a content is missing or out of order."""
    pieces, at = [], 0
    for message in messages:
        found = text.find(message["content"], at)
        if found < 0:
            return None
        pieces.append(text[at:found])
        at = found + len(message["content"])
    return [*pieces, text[at:]]


@dataclass(frozen=True)
class Framing:
    """What a chat template writes around the messages (see the module docstring)."""

    head: str  # before the first message's content
    system_user: str | None  # between a system message and a user one; None: no system role
    user_assistant: str
    assistant_user: str

    @classmethod
    def learn(cls, render: Render, *, system: bool) -> Framing | None:
        """The template's framing of a conversation that starts with a system message (or
        with none), from a probe render; None when it frames rounds unalike or refuses it."""
        roles = ("system",) if system else ()
        probe = _probe(*roles, "user", "assistant", "user", "assistant")
        try:
            pieces = _between(render(probe, False), probe)
        except (InvalidMessagesError, TemplateError):
            return None  # e.g. a template that refuses a system message
        if pieces is None:
            return None  # e.g. a system message merged into the first user one
        head, *rounds = pieces
        system_user = rounds.pop(0) if system else None
        user_assistant, assistant_user, again, _tail = rounds
        if again != user_assistant or not user_assistant or not assistant_user:
            return None
        return cls(head, system_user, user_assistant, assistant_user)

    def parse(self, text: str) -> list[Message] | None:
        """`text` (a mind's, ending in an assistant's answer) as messages; None when it does
        not follow the framing."""
        if not text.startswith(self.head):
            return None
        rest = text[len(self.head) :]
        out: list[Message] = []
        if self.system_user is not None:
            content, found, rest = rest.partition(self.system_user)
            if not found:
                return None
            out.append({"role": "system", "content": content})
        while True:
            content, found, rest = rest.partition(self.user_assistant)
            if not found:
                return None  # it ends inside a user message: no answer to extend
            out.append({"role": "user", "content": content})
            content, found, rest = rest.partition(self.assistant_user)
            out.append({"role": "assistant", "content": content})
            if not found:  # the last answer (a mind never holds its end-of-turn token)
                return out


def history(text: str, render: Render) -> list[Message] | None:
    """The mind's `text` as the messages that render it again (see the module docstring).

    A conversation without a system message is tried first: a template that writes a default
    system prompt (SmolLM2's, Qwen's) then gives the client's messages, not its own prompt."""
    for system in (False, True):
        framing = Framing.learn(render, system=system)
        messages = framing.parse(text) if framing is not None else None
        if messages and _renders(render, messages, text):
            return messages
    return None


def _renders(render: Render, messages: list[Message], text: str) -> bool:
    try:
        return render(messages, False).startswith(text)
    except (InvalidMessagesError, TemplateError):
        return False
