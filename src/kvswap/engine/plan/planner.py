"""The step planner: which tokens of which slots go into the next `llama_decode`.

Pure: no libllama, no I/O, no clocks. Continuous batching without prefill and decode phases:
each busy slot catches up its computed tokens toward its total. Decoding slots come first (one
token each, with logits), so a decoding slot gets a token every step even while another slot
prefills a long prompt; prompt chunks then fill the rest of the per-step token budget in
admission order. A chunk gets logits only when it finishes its prompt.

    budget = 8, slot 0 decoding, slot 1 with 20 prompt tokens left, slot 2 with 3 left:
    [s0: 1 tok, logits] [s1: 7 toks] -> next step [s0: 1] [s1: 7] -> [s0: 1] [s1: 6, logits] [s2: 1]

In a unified KV pool a step may also be held to the cells still free (`n_cells`), once the
engine has moved out what it could (`engine.room`): prompt chunks then shrink to what fits, so
a decode never fails for want of cells the engine knew it lacked. `cells_at_end` is what a
request will hold when it ends, as far as it can be foreseen (its prompt, and its `n_predict`
when bounded), which is what the engine checks before it starts one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotWork:
    """What one busy slot still has to compute."""

    slot_id: int
    n_decode: int  # tokens to decode this step with logits for each (0 when prefilling)
    n_prompt_left: int  # prompt tokens not yet in the KV
    admitted: int  # admission order (lower = earlier); prefill is served in this order
    chunk_limit: int = 0  # > 0: cut this slot's prompt chunk at this many tokens


@dataclass(frozen=True)
class Span:
    """A run of consecutive tokens of one slot in the batch."""

    slot_id: int
    n_tokens: int
    is_decode: bool  # True: generated tokens (logits for each); False: a prompt chunk
    ends_prompt: bool  # a prompt chunk that completes the prompt (logits for its last token)


@dataclass(frozen=True)
class StepPlan:
    """The batch of one step, in batch order (decodes first)."""

    spans: tuple[Span, ...]

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans)

    @property
    def n_prompt_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans if not s.is_decode)


def plan_step(work: list[SlotWork], budget: int, n_cells: int | None = None) -> StepPlan:
    """Plan one step within `budget` tokens, and when given within `n_cells` free KV cells
    (decode tokens are always admitted: a decode that cannot fit fails, and the engine's
    full-pool path answers it)."""
    limit = budget if n_cells is None else min(budget, n_cells)
    spans: list[Span] = []
    used = 0
    for w in work:
        if w.n_decode > 0:
            spans.append(Span(w.slot_id, w.n_decode, is_decode=True, ends_prompt=False))
            used += w.n_decode
    for w in sorted(work, key=lambda w: w.admitted):
        if w.n_decode > 0 or w.n_prompt_left <= 0:
            continue
        room = limit - used
        if room <= 0:
            break
        n = min(room, w.n_prompt_left)
        if w.chunk_limit > 0:
            n = min(n, w.chunk_limit)
        spans.append(Span(w.slot_id, n, is_decode=False, ends_prompt=n == w.n_prompt_left))
        used += n
    return StepPlan(tuple(spans))


def cells_at_end(n_prompt: int, n_predict: int, n_ctx_slot: int, n_held: int = 0) -> int:
    """The KV cells a request will hold when it ends, as far as it can be foreseen: its prompt
    and its `n_predict` tokens (none when unbounded: its growth is met by the full-pool path),
    at most its slot's window, and never less than the `n_held` it holds now.

        prompt 2500, n_predict 8, window 8192 -> 2508;  n_predict -1 -> 2500
    """
    return max(n_held, min(n_prompt + max(0, n_predict), n_ctx_slot))
