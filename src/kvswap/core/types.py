"""The typed data that crosses the boundary between HTTP handlers and the engine thread.

Requests go in as `GenerationRequest`; results come out as events (`MindSeated` first for a
mind's request, `PromptProgress`, `TokenEvent`, `Completion`, `EngineError`). Everything here
is immutable plain data: no pointers, no locks, no libllama.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import PUBLIC_NAMESPACE, PageKey
from kvswap.core.sampling import SamplingParams
from kvswap.core.vocab import MindSource

# A LoRA set: (adapter id, scale) pairs, sorted by id, no zero scales.
LoraSet = tuple[tuple[int, float], ...]


class StopType(StrEnum):
    """Why generation ended, as llama-server's `stop_type`."""

    NONE = "none"  # cancelled or not finished
    EOS = "eos"  # an end-of-generation token
    LIMIT = "limit"  # n_predict reached, or the slot's window is full
    WORD = "word"  # a stop string matched


@dataclass(frozen=True)
class GenerationRequest:
    """One completion request, tokenized, as the engine runs it."""

    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until EOS, a stop string or the slot's window
    stop: tuple[str, ...] = ()
    id_slot: int = -1  # -1: choose by prefix similarity, then LRU
    cache_prompt: bool = True
    n_probs: int = 0  # top-N probabilities per generated token
    post_sampling_probs: bool = False
    return_progress: bool = False
    timings_per_token: bool = False
    stream: bool = False
    t_max_predict_ms: int = 0  # 0: no time limit on generation
    # The LoRA set it runs under (engine.lora.LoraSet: (adapter id, scale), sorted, no zeros),
    # and the request's own `lora` field as sent (reported in /slots and generation_settings).
    lora: LoraSet = ()
    lora_request: LoraSet = ()
    mind: PageKey | None = None  # the mind's key (core.keys.mind_key); None: anonymous
    # The tenant that sent it (core.keys.namespace_of its API key): an anonymous request reuses
    # only the prefixes its own tenant left in slots and in the anonymous cache.
    namespace: str = PUBLIC_NAMESPACE
    # A retention floor (Anthropic's cache_control): a mind's state stays in some tier (RAM or
    # disk) at least this many seconds after this turn; 0: none.
    retain_s: int = 0
    # A mind with no state anywhere takes the anonymous KV holding its prompt's longest prefix
    # (a stored conversation's second turn adopts its first, which ran without a mind); else
    # a new mind starts from an empty slot.
    adopt_prefix: bool = False
    # A mind's chat turn: where its prompt ends, so that its next turn can continue the mind's
    # own tokens (`minds.histories`); None: not a chat turn of a mind.
    turn_mark: TurnMark | None = None


@dataclass(frozen=True)
class TurnMark:
    """A mind's chat turn as its next one needs it (`minds.histories.LastTurn`)."""

    n_messages: int  # the chat messages of the request
    prompt_chars: int  # the rendered prompt text: its length and digest
    prompt_digest: str
    opening: str = ""  # the system prompt's digest (`server.requests.resent.system_digest`)


@dataclass(frozen=True)
class Timings:
    """llama-server's `timings` object."""

    cache_n: int  # prompt tokens reused from the slot's cache
    prompt_n: int  # prompt tokens evaluated
    prompt_ms: float
    predicted_n: int
    predicted_ms: float  # from the end of the prompt to the last token
    speculative: bool = False  # the server drafts: the draft fields below are reported
    draft_n: int = 0  # draft tokens sent to the target
    draft_n_accepted: int = 0  # draft tokens the target accepted
    draft_prompt_n: int = 0  # prompt tokens the draft model evaluated (its own prefill)

    @property
    def prompt_per_token_ms(self) -> float:
        return self.prompt_ms / self.prompt_n if self.prompt_n > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1e3 / self.prompt_ms * self.prompt_n if self.prompt_ms > 0 else 0.0

    @property
    def predicted_steps(self) -> int:
        # The first generated token comes from the prompt's logits: it costs no decode step.
        return max(0, self.predicted_n - 1)

    @property
    def predicted_per_token_ms(self) -> float:
        steps = self.predicted_steps
        return self.predicted_ms / steps if steps > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        steps = self.predicted_steps
        return 1e3 / self.predicted_ms * steps if self.predicted_ms > 0 else 0.0


@dataclass(frozen=True)
class MindServed:
    """How a mind's turn was served: where its state was, how long the switch into its slot
    took, and how much of its history the request's prompt kept. A prompt that does not extend
    the whole history diverges: the tokens past `n_kept` are dropped (the mind goes on from
    the request's own conversation)."""

    key: PageKey
    source: MindSource
    switch_ms: float  # bringing its state into the slot (a read or fetch before it included)
    n_tokens: int  # the tokens it held before this turn
    n_kept: int  # of those, the prefix this request's prompt shares

    @property
    def n_dropped(self) -> int:
        return self.n_tokens - self.n_kept

    @property
    def diverged(self) -> bool:
        return self.n_kept < self.n_tokens


@dataclass(frozen=True)
class MindSeated:
    """A mind's request is seated, before any of its output: how it was served (the HTTP
    side answers it in headers, so it comes first)."""

    req_id: int
    served: MindServed


@dataclass(frozen=True)
class TokenProb:
    """One candidate token and its probability (or log-probability)."""

    token: int
    piece: bytes
    prob: float  # probability in [0, 1]


@dataclass(frozen=True)
class TokenProbs:
    """The sampled token and the top candidates at its position."""

    token: int
    piece: bytes
    prob: float
    top: tuple[TokenProb, ...]


@dataclass(frozen=True)
class PromptProgress:
    """Prefill progress (`return_progress`), as llama-server's `prompt_progress`."""

    req_id: int
    total: int  # prompt tokens in all
    cache: int  # reused from the cache
    processed: int  # cache + evaluated so far
    time_ms: float
    timings: Timings | None = None  # with timings_per_token, as llama-server


@dataclass(frozen=True)
class TokenEvent:
    """Text produced by one step for one request (may be empty while text is held back)."""

    req_id: int
    id_slot: int
    text: str
    tokens: tuple[int, ...]
    n_decoded: int
    n_prompt_tokens: int
    probs: tuple[TokenProbs, ...] = ()
    timings: Timings | None = None


@dataclass(frozen=True)
class Completion:
    """The final result of a request."""

    req_id: int
    id_slot: int
    content: str
    tokens: tuple[int, ...]
    n_decoded: int
    n_prompt_tokens: int
    n_tokens_cached: int  # tokens held in the slot at the end
    stop_type: StopType
    stopping_word: str
    timings: Timings
    seed: int  # the seed the sampler actually used
    sampling: SamplingParams
    n_predict: int
    probs: tuple[TokenProbs, ...] = ()
    cancelled: bool = False
    served: MindServed | None = None  # a mind's request: how its mind was served


@dataclass(frozen=True)
class EngineError:
    """A request failed; the error is typed for the HTTP layer."""

    req_id: int
    kind: ErrorKind
    message: str
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class MindOnDisk:
    """A mind's request did not run: its mind went to disk after the request looked for it
    (`MindMovedToDisk`). The request's last event; it is sent again with the state read."""

    req_id: int


Event = MindSeated | PromptProgress | TokenEvent | Completion | EngineError
