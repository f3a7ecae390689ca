"""The Responses answer made from a finished or streaming generation: the whole response
object (`whole_response`), and the stream's events (`ResponseStream`: created and in-progress
first, output items and their deltas as the parser releases them, then completed), whose last
events are made once (`finish`) so a stored turn can write them before they go out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvswap.chat.blocks import BlockStream
from kvswap.chat.parser import ChatParser
from kvswap.core.types import Completion, Event, PromptProgress, TokenEvent
from kvswap.server.openai import formats_responses as fr
from kvswap.server.requests.chat import ChatPlan
from kvswap.server.requests.serving import Serving


def n_reasoning(state: Serving, reasoning: str) -> int:
    """The output tokens of the reasoning items: its text tokenized again (model-made text
    tokenizes back into the tokens that made it, up to merges at its two ends)."""
    return len(state.tokenize(reasoning, False, True)) if reasoning else 0


def whole_response(state: Serving, meta: fr.ResponseMeta, plan: ChatPlan, c: Completion) -> Any:
    """The response object of a finished generation."""
    msg = ChatParser(plan.spec).parse_all(c.content)
    n = n_reasoning(state, msg.reasoning_content)
    output = fr.output_items(msg)
    return fr.response_json(meta, status="completed", output=output, c=c, n_reasoning=n)


class ResponseStream:
    """The Responses stream's events: created and in-progress first, output items and their
    deltas as the parser releases them, then completed (with the reasoning's token count);
    `finish` makes the last events once (a stored turn writes them before they go out)."""

    def __init__(self, state: Serving, plan: ChatPlan, events: fr.ResponseEvents) -> None:
        self.state = state
        self.events = events
        self.parser = ChatParser(plan.spec)
        self.blocks = BlockStream()
        self.started = False
        self.final: list[dict[str, Any]] | None = None

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return self.events.start()

    def render(self, _: int, event: Event) -> Iterable[dict[str, Any]]:
        if isinstance(event, Completion):
            yield from self.finish(event)
            return
        yield from self._start()
        events = self.events
        if isinstance(event, TokenEvent):
            out = events.blocks(self.blocks.feed(self.parser.feed(event.text)))
            if out and event.timings is not None:  # timings_per_token: on the step's last event
                out[-1]["timings"] = fr.timings_json(event.timings)
            yield from out
        elif isinstance(event, PromptProgress):
            yield events.progress(event)

    def finish(self, c: Completion) -> list[dict[str, Any]]:
        if self.final is None:
            events = self.events
            out = self._start()
            out += events.blocks(self.blocks.feed(self.parser.finish()) + self.blocks.close())
            n = n_reasoning(self.state, self.parser.msg.reasoning_content)
            self.final = out + events.complete(c, n)
        return self.final
