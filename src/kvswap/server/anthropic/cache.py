"""Anthropic's prompt caching on kvswap: where a request's `cache_control` breakpoints lie in its
prompt, and the usage that says what was read, newly kept and prefilled.

- A breakpoint (on a tool, a system block, a message's block, or the top-level automatic one,
  which marks the last block) ends at the end of the message that holds it: the system prompt
  (with the tools) for a tool's or a system block's. `breakpoints` counts the chat messages up
  to there; `marks` turns them into prompt token positions (`requests.chat.prefix_length`),
  by TTL (`5m`, the default, and `1h`).
- A request that runs under a mind (named, or a session key's) keeps what it prefills: its
  breakpoints set the mind's retention floor (`GenerationRequest.retain_s`: the longest TTL),
  so its state stays at least that long in some tier (RAM or disk). The anonymous cache keeps
  no floor.
- Usage (`usage`): `cache_read_input_tokens` are the prompt tokens whose KV was reused from any
  tier (`timings.cache_n`); `cache_creation_input_tokens` those newly prefilled up to the last
  breakpoint and kept under a mind, split by TTL in `cache_creation`; `input_tokens` the rest.
  The three add up to the prompt.

Called by the Messages route (`anthropic.routes`); pure but for `marks`' rendering.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvswap.server.anthropic.schemas import CACHE_TTL_S, MessagesRequest, to_chat_messages
from kvswap.server.requests.chat import ChatPlan, prefix_length
from kvswap.server.requests.schemas import ChatCompletionRequest
from kvswap.server.requests.serving import Serving

TTL_1H_S = CACHE_TTL_S["1h"]


@dataclass(frozen=True)
class Breakpoint:
    """A `cache_control` breakpoint: the chat messages it covers and its TTL."""

    n_messages: int
    ttl_s: int


@dataclass(frozen=True)
class CacheMarks:
    """Where a request's breakpoints end in its prompt, in tokens (0: none of that TTL), and
    whether what it prefills is kept (it runs under a mind)."""

    end_5m: int = 0
    end_1h: int = 0
    kept: bool = False

    @property
    def retain_s(self) -> int:
        """The retention floor the request sets on its mind (0: none)."""
        if not self.kept:
            return 0
        return TTL_1H_S if self.end_1h else CACHE_TTL_S["5m"] if self.end_5m else 0


def breakpoints(req: MessagesRequest) -> list[Breakpoint]:
    """The request's breakpoints, each as the chat messages it covers (`to_chat_body`'s)."""
    out: list[Breakpoint] = []
    n_system = 1 if req.system is not None else 0
    for tool in req.tools or ():
        if tool.cache_control is not None:
            out.append(Breakpoint(n_system, tool.cache_control.ttl_s))
    if isinstance(req.system, list):
        for block in req.system:
            if block.cache_control is not None:
                out.append(Breakpoint(n_system, block.cache_control.ttl_s))
    n = n_system
    for i, msg in enumerate(req.messages):
        n += len(to_chat_messages(msg, i))
        blocks = msg.content if isinstance(msg.content, list) else []
        for block in blocks:
            if block.cache_control is not None:
                out.append(Breakpoint(n, block.cache_control.ttl_s))
    if req.cache_control is not None:
        out.append(Breakpoint(n, req.cache_control.ttl_s))
    return out


def marks(
    state: Serving,
    req: MessagesRequest,
    body: ChatCompletionRequest,
    plan: ChatPlan,
    prompt: Sequence[int],
    *,
    kept: bool,
) -> CacheMarks:
    """Where the request's last breakpoint of each TTL ends in its `prompt` (the only ones
    usage needs: a later breakpoint ends later; at most two renders); `kept`: it runs under a
    mind (else nothing is created, and nothing is rendered)."""
    if not kept:
        return CacheMarks()
    last = {True: -1, False: -1}  # 1h?: the most messages a breakpoint of that TTL covers
    for bp in breakpoints(req):
        long = bp.ttl_s >= TTL_1H_S
        last[long] = max(last[long], bp.n_messages)
    ends = {
        long: prefix_length(state, body, plan, n, prompt) if n >= 0 else 0
        for long, n in last.items()
    }
    return CacheMarks(end_5m=ends[False], end_1h=ends[True], kept=kept)


def usage(n_prompt: int, n_cached: int, n_output: int, cache: CacheMarks) -> dict[str, Any]:
    """Anthropic's usage object: read, created (by TTL) and uncached input add up to
    `n_prompt`."""
    created_1h = created_5m = 0
    if cache.kept:
        created_1h = max(0, min(cache.end_1h, n_prompt) - n_cached)
        created_5m = max(0, min(cache.end_5m, n_prompt) - max(n_cached, cache.end_1h))
    created = created_1h + created_5m
    return {
        "input_tokens": n_prompt - n_cached - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": n_cached,
        "cache_creation": {
            "ephemeral_5m_input_tokens": created_5m,
            "ephemeral_1h_input_tokens": created_1h,
        },
        "output_tokens": n_output,
    }
