"""The cluster tests' workload: many minds chatting through the OpenAI client, a few turns each.

Mind `i`'s conversation is fixed by `i` alone (its name does not enter the prompt), so a run
under other names, on other replicas, after a kill, is compared turn by turn with a run
without faults. Greedy, 8 tokens a turn. A turn that breaks (the connection cut, HAProxy's
502, a 503) is retried once, as a client does after its replica died.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

N_PREDICT = 8


def opening(index: int) -> str:
    return f"You are mind number {index}. Remember the colour {index * 7 % 13} and the sea."


def user_text(index: int, turn: int) -> str:
    return f"Turn {turn} for mind {index}: say something about stone {turn + index}."


@dataclass
class TurnResult:
    index: int  # the mind's conversation
    turn: int
    text: str
    replica: str
    cache_n: int  # prompt tokens the replica had (its state, restored or resident)
    prompt_n: int  # prompt tokens it prefilled
    n_attempts: int
    t_end: float = field(default_factory=time.monotonic)  # when its answer was complete


@dataclass
class Conversation:
    index: int
    name: str
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [{"role": "system", "content": opening(self.index)}]


class BrokenTurn(Exception):
    """A turn that failed twice."""


def chat_turn(
    client: openai.OpenAI,
    conv: Conversation,
    turn: int,
    *,
    n_predict: int = N_PREDICT,
    retries: int = 1,
) -> TurnResult:
    """One turn of `conv` (appended to it), retried `retries` times if it breaks."""
    messages: Any = [*conv.messages, {"role": "user", "content": user_text(conv.index, turn)}]
    errors: list[str] = []
    for attempt in range(1 + retries):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=messages,
                max_tokens=n_predict,
                temperature=0,
                extra_headers={"X-Mind-Id": conv.name},
            )
        except (openai.APIConnectionError, openai.InternalServerError) as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        except openai.APIStatusError as err:
            if err.status_code in (502, 503):
                errors.append(f"{err.status_code}: {err.message}")
                continue
            raise
        done = raw.parse()
        text = done.choices[0].message.content or ""
        timings = (done.model_extra or {})["timings"]
        conv.messages = [*messages, {"role": "assistant", "content": text}]
        return TurnResult(
            conv.index, turn, text, raw.headers["x-kvswap-replica"], int(timings["cache_n"]),
            int(timings["prompt_n"]), attempt + 1,
        )  # fmt: skip
    raise BrokenTurn(f"mind {conv.name} turn {turn} failed {1 + retries} times: {errors}")


def stream_turn(
    client: openai.OpenAI,
    conv: Conversation,
    turn: int,
    *,
    n_predict: int,
    on_first: Callable[[], None] | None = None,
    retries: int = 1,
) -> TurnResult:
    """A streamed turn; `on_first()` runs once its first chunk has arrived (the turn is then
    running on its replica). A stream that breaks is sent again, `retries` times."""
    messages: Any = [*conv.messages, {"role": "user", "content": user_text(conv.index, turn)}]
    errors: list[str] = []
    for attempt in range(1 + retries):
        text, timings, replica = "", {}, ""
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=messages,
                max_tokens=n_predict,
                temperature=0,
                stream=True,
                extra_headers={"X-Mind-Id": conv.name},
            )
            replica = raw.headers["x-kvswap-replica"]
            for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                timings = (chunk.model_extra or {}).get("timings", timings)
                if on_first is not None:
                    on_first()
                    on_first = None
        except (openai.APIError, httpx.HTTPError) as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        conv.messages = [*messages, {"role": "assistant", "content": text}]
        return TurnResult(
            conv.index, turn, text, replica, int(timings["cache_n"]), int(timings["prompt_n"]),
            attempt + 1,
        )  # fmt: skip
    raise BrokenTurn(f"mind {conv.name} turn {turn} failed {1 + retries} times: {errors}")


def client(url: str) -> openai.OpenAI:
    # retries are the workload's own (counted), not the client's
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=180)


Results = dict[tuple[int, int], TurnResult]


def run(
    url: str,
    convs: Sequence[Conversation],
    turns: Sequence[int],
    *,
    n_threads: int = 6,
    after_turn: Callable[[TurnResult], None] | None = None,
) -> Results:
    """Each conversation's `turns` in order; conversations in parallel on `n_threads`."""
    out: Results = {}
    lock = threading.Lock()
    local = threading.local()

    def one(conv: Conversation) -> None:
        if not hasattr(local, "client"):
            local.client = client(url)
        for turn in turns:
            result = chat_turn(local.client, conv, turn)
            with lock:
                out[(conv.index, turn)] = result
            if after_turn is not None:
                after_turn(result)

    with ThreadPoolExecutor(n_threads) as pool:
        for done in [pool.submit(one, c) for c in convs]:
            done.result()
    return out
