"""The cluster tests' workload: many minds chatting through the OpenAI client, a few turns each.

Mind `i`'s conversation is fixed by `i` alone (its name does not enter the prompt), so a run
under other names, on other replicas, after a kill, is compared turn by turn with a run
without faults. Greedy, 8 tokens a turn, sent by the OpenAI client: a turn that breaks (the
connection cut, HAProxy's 502, a 503) is retried once, after the client's back-off, as a client
does after its replica died.

A mind keeps the model's own tokens for its answers, whose KV its decode steps computed; a
mind prefilled again after a fault computes them in a prompt batch, and llama.cpp's float
results differ by ~0.01 between the two. So two runs agree token for token (`agree`) except
at a near tie: a divergence where the fault-free run's two best tokens were within `NEAR_TIE`
nats of each other is that noise (printed), and the conversation then goes its own way; one
anywhere else is a defect (stale or wrong KV).
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
NEAR_TIE = 0.02  # nats between the two best tokens: a divergence there is float noise


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
    # when its (last) request was sent: a turn sent after a replica died never reaches it,
    # while one that replica answered just before may still be read after its death
    t_sent: float = 0.0
    tier_before: str = ""  # where its mind's state was (X-Kvswap-Tier-Before)
    tokens: tuple[bytes, ...] = ()  # the answer's tokens (their bytes)
    margins: tuple[float, ...] = ()  # each token's lead over the next best (nats)


def agree(got: TurnResult, want: TurnResult, *, prompt_may_differ: bool = False) -> bool:
    """True when `got` answered `want`'s tokens; False when it diverged from them at a near
    tie (see the module docstring: printed, and later turns of the conversation differ too);
    an AssertionError names a divergence anywhere else. `prompt_may_differ`: a fault may have
    lost the mind's last turn with its tokens (Redis away when it was written), so the prompt
    renders that answer's text anew instead of continuing the model's tokens; a prompt of
    another length is then no divergence either (its answer is its own)."""
    if got.tokens == want.tokens:
        return True
    n_got, n_want = got.cache_n + got.prompt_n, want.cache_n + want.prompt_n
    if prompt_may_differ and n_got != n_want:
        print(f"mind {got.index} turn {got.turn}: a prompt of {n_got} tokens, not {n_want}")
        return False
    at = next(
        (i for i, (a, b) in enumerate(zip(got.tokens, want.tokens, strict=False)) if a != b),
        min(len(got.tokens), len(want.tokens)),
    )
    margin = want.margins[at] if at < len(want.margins) else float("inf")
    where = f"mind {got.index} turn {got.turn} diverged at token {at} (top-2 margin {margin:.4f})"
    assert margin < NEAR_TIE, f"{where}: {got} against {want}"
    print(f"{where}: a near tie")
    return False


def _logprobs(entries: Sequence[Any]) -> tuple[tuple[bytes, ...], tuple[float, ...]]:
    """The tokens and margins of an answer's `logprobs.content` entries."""
    tokens, margins = [], []
    for entry in entries:
        tokens.append(bytes(entry.bytes or entry.token.encode()))
        top = [t.logprob for t in entry.top_logprobs or []]
        margins.append(top[0] - top[1] if len(top) > 1 else float("inf"))
    return tuple(tokens), tuple(margins)


@dataclass
class Conversation:
    index: int
    name: str
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages = [{"role": "system", "content": opening(self.index)}]


class BrokenTurn(Exception):
    """A turn that failed, retry included."""


# The OpenAI client's first retry delay: a client backs off before it sends a broken request
# again (immediately, it could reach the dying replica once more). Client behaviour under test.
CLIENT_BACKOFF_S = 0.5


class ChatClient:
    """The OpenAI client, which retries a failed request once with its own back-off (a broken
    connection, HAProxy's 502, a 503 with Retry-After), counting the requests it sends."""

    def __init__(self, url: str, retries: int = 1) -> None:
        self.n_sent = 0

        def sent(_: httpx.Request) -> None:
            self.n_sent += 1

        http = httpx.Client(event_hooks={"request": [sent]}, timeout=180)
        self.oai = openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=retries, http_client=http
        )


def _messages(conv: Conversation, turn: int) -> Any:
    return [*conv.messages, {"role": "user", "content": user_text(conv.index, turn)}]


def _send(
    client: ChatClient, conv: Conversation, messages: Any, n_predict: int, *, stream: bool
) -> Any:
    return client.oai.chat.completions.with_raw_response.create(
        model="tiny",
        messages=messages,
        max_tokens=n_predict,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=stream,
        extra_headers={"X-Mind-Id": conv.name},
    )


def chat_turn(
    client: ChatClient, conv: Conversation, turn: int, *, n_predict: int = N_PREDICT
) -> TurnResult:
    """One turn of `conv` (appended to it)."""
    messages = _messages(conv, turn)
    n_sent = client.n_sent
    t_sent = time.monotonic()
    try:
        raw = _send(client, conv, messages, n_predict, stream=False)
    except openai.APIError as err:
        raise BrokenTurn(f"mind {conv.name} turn {turn}: {err!r} ({err.__cause__!r})") from err
    done = raw.parse()
    text = done.choices[0].message.content or ""
    timings = (done.model_extra or {})["timings"]
    conv.messages = [*messages, {"role": "assistant", "content": text}]
    logprobs = done.choices[0].logprobs
    tokens, margins = _logprobs(logprobs.content or [] if logprobs is not None else [])
    return TurnResult(
        conv.index, turn, text, raw.headers["x-kvswap-replica"], int(timings["cache_n"]),
        int(timings["prompt_n"]), client.n_sent - n_sent, t_sent=t_sent,
        tier_before=raw.headers.get("x-kvswap-tier-before", ""), tokens=tokens, margins=margins,
    )  # fmt: skip


def stream_turn(
    client: ChatClient,
    conv: Conversation,
    turn: int,
    *,
    n_predict: int,
    on_first: Callable[[], None] | None = None,
    resend: bool = True,
) -> TurnResult:
    """A streamed turn; `on_first()` runs once its first chunk has arrived (the turn is then
    running on its replica). A stream that breaks is sent again once (`resend`), after the
    client's back-off."""
    messages = _messages(conv, turn)
    errors: list[str] = []
    n_sent = client.n_sent
    for attempt in range(2 if resend else 1):
        if attempt:
            time.sleep(CLIENT_BACKOFF_S)
        text, timings, replica, entries = "", {}, "", []
        t_sent = time.monotonic()
        try:
            raw = _send(client, conv, messages, n_predict, stream=True)
            replica = raw.headers["x-kvswap-replica"]
            for chunk in raw.parse():
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.choices and chunk.choices[0].logprobs is not None:
                    entries += chunk.choices[0].logprobs.content or []
                timings = (chunk.model_extra or {}).get("timings", timings)
                if on_first is not None:
                    on_first()
                    on_first = None
        except (openai.APIError, httpx.HTTPError) as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        conv.messages = [*messages, {"role": "assistant", "content": text}]
        tokens, margins = _logprobs(entries)
        return TurnResult(
            conv.index, turn, text, replica, int(timings["cache_n"]), int(timings["prompt_n"]),
            client.n_sent - n_sent, t_sent=t_sent, tokens=tokens, margins=margins,
        )  # fmt: skip
    raise BrokenTurn(f"mind {conv.name} turn {turn}: {errors}")


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
            local.client = ChatClient(url)
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
