"""Whether a submitted request may wait for a slot (`engine.admission.check_request`)."""

from __future__ import annotations

from kvswap.core.errors import ErrorKind
from kvswap.core.types import GenerationRequest
from kvswap.engine.admission import check_request


def _check(req: GenerationRequest, *, n_slots: int = 2, n_ctx_slot: int = 8):
    return check_request(
        7, req, n_slots=n_slots, n_ctx_slot=n_ctx_slot, n_adapters=1, valid_token=lambda t: t < 100
    )


def test_a_fitting_request_may_wait() -> None:
    assert _check(GenerationRequest(prompt_tokens=(1, 2, 3))) is None
    assert _check(GenerationRequest(prompt_tokens=(1,), id_slot=1, lora=((0, 0.5),))) is None


def test_refusals_are_typed_and_name_what_is_wrong() -> None:
    cases = [
        (GenerationRequest(prompt_tokens=(1,), id_slot=2), ErrorKind.INVALID_REQUEST, "slot ID: 2"),
        (GenerationRequest(prompt_tokens=(1,), id_slot=-2), ErrorKind.INVALID_REQUEST, "slot ID"),
        (GenerationRequest(prompt_tokens=()), ErrorKind.INVALID_REQUEST, "prompt is empty"),
        (GenerationRequest(prompt_tokens=(1,) * 8), ErrorKind.EXCEED_CONTEXT, "(8 tokens)"),
        (
            GenerationRequest(prompt_tokens=(1,), lora=((1, 1.0),)),
            ErrorKind.INVALID_REQUEST,
            "LoRA",
        ),
        (
            GenerationRequest(prompt_tokens=(1, 100)),
            ErrorKind.INVALID_REQUEST,
            "token id in prompt: 100",
        ),
    ]
    for req, kind, words in cases:
        err = _check(req)
        assert err is not None and err.req_id == 7
        assert err.kind is kind and words in err.message, (req, err)


def test_a_prompt_one_token_short_of_the_window_fits() -> None:
    assert _check(GenerationRequest(prompt_tokens=(1,) * 7)) is None
    err = _check(GenerationRequest(prompt_tokens=(1,) * 8))
    assert err is not None and err.extra == {"n_prompt_tokens": 8, "n_ctx": 8}
