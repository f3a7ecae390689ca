"""Pure: whether a submitted request can run under the current geometry, and what to say if not.

Checked when a request arrives and again for every waiting request after a reconfigure (the
windows and the slot count may have changed). No libllama: the vocabulary is only asked which
token ids are valid.
"""

from __future__ import annotations

from collections.abc import Callable

from kvswap.config.advice import Trained, WindowShape, exceeds_context_message
from kvswap.core.errors import ErrorKind
from kvswap.core.types import EngineError, GenerationRequest


def check_request(
    req_id: int,
    req: GenerationRequest,
    *,
    n_slots: int,
    n_ctx_slot: int,
    n_adapters: int,
    valid_token: Callable[[int], bool],
    shape: WindowShape | None = None,
    trained: Trained | None = None,
) -> EngineError | None:
    """The typed refusal of `req`, or None when it may wait for a slot; a prompt too long for
    the window is told which flags of `shape` would make it fit."""
    n = len(req.prompt_tokens)
    if not -1 <= req.id_slot < n_slots:
        return EngineError(req_id, ErrorKind.INVALID_REQUEST, f"Invalid slot ID: {req.id_slot}")
    if n == 0:
        return EngineError(req_id, ErrorKind.INVALID_REQUEST, "the prompt is empty")
    if n >= n_ctx_slot:
        return EngineError(
            req_id,
            ErrorKind.EXCEED_CONTEXT,
            exceeds_context_message(n, n_ctx_slot, shape, trained),
            {"n_prompt_tokens": n, "n_ctx": n_ctx_slot},
        )
    if any(not 0 <= i < n_adapters for i, _ in req.lora):
        return EngineError(req_id, ErrorKind.INVALID_REQUEST, "unknown LoRA adapter id")
    bad = [t for t in req.prompt_tokens if not valid_token(t)]
    if bad:
        return EngineError(
            req_id, ErrorKind.INVALID_REQUEST, f"invalid token id in prompt: {bad[0]}"
        )
    return None
