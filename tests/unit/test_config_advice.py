"""A prompt too long for its slot is told which flags would fit it (`config.advice`).

Each case builds the geometry the engine builds from the flags (`resolve_geometry`), so the
advice is checked against the windows a server really has.
"""

from __future__ import annotations

from kvswap.config.advice import Trained, exceeds_context_message
from kvswap.engine.plan.geometry import Geometry, resolve_geometry

LLAMA_SERVER = (
    "request (2531 tokens) exceeds the available context size ({} tokens), try increasing it"
)


def _geometry(
    n_ctx: int, n_parallel: int, *, kvu: bool | None = None, per_slot: int = 0
) -> Geometry:
    return resolve_geometry(
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_unified=kvu,
        kv_unified_per_slot=per_slot,
        n_batch=2048,
        n_ubatch=512,
        cache_type_k="f16",
        cache_type_v="f16",
        n_ctx_train=8192,
    )


def _refusal(geometry: Geometry, n_ctx_train: int = 8192) -> str:
    n_ctx_slot = geometry.n_ctx_slot(n_ctx_train)
    assert n_ctx_slot <= 2531  # each case is one the prompt does not fit
    message = exceeds_context_message(2531, n_ctx_slot, geometry, Trained(n_ctx_train, "llama"))
    assert message.startswith(LLAMA_SERVER.format(n_ctx_slot) + ": "), message
    return message.split(": ", 1)[1]


def test_without_a_geometry_the_message_is_llama_servers() -> None:
    assert exceeds_context_message(2531, 2048, None) == LLAMA_SERVER.format(2048)


def test_slots_of_a_split_pool_are_told_to_unify_it() -> None:
    """-c 8192 -np 4 (no -kvu): four fixed windows of 2048; -kvu lets one slot use all 8192."""
    advice = _refusal(_geometry(8192, 4))
    assert "-np 4 without -kvu splits the pool (-c 8192) into 4 fixed windows" in advice
    assert "start with -kvu" in advice and "-c above 10124" in advice
    assert 'POST /reconfigure {"n_parallel": 1}' in advice
    assert _geometry(8192, 4, kvu=True).n_ctx_slot(8192) == 8192  # the fix it names does fit


def test_a_whole_pool_too_small_is_told_a_larger_c() -> None:
    for geometry in (_geometry(2048, 4, kvu=True), _geometry(2048, 1), _geometry(2048, -1)):
        advice = _refusal(geometry)
        assert advice == (
            "the whole KV pool is -c 2048 tokens; start with -c above 2531, or on this server: "
            'POST /reconfigure {"n_ctx": 3072}, if the model was trained on that many tokens '
            "(no slot takes more than its training context)"
        )


def test_a_per_slot_cap_is_named() -> None:
    advice = _refusal(_geometry(8192, 4, kvu=True, per_slot=2048))
    assert advice.startswith("--kv-unified-per-slot 2048 caps every slot")


def test_the_training_context_is_extended_by_yarn_and_the_flags_named_fit_the_prompt() -> None:
    """A slot capped by the training context is told the -c whose slot holds the prompt (kvswap
    extends the context by YaRN itself) and llama-server's four flags for the smallest
    extension (before: "needs a model trained on a longer context", though the flags exist);
    the pool the advice names holds the prompt in one slot."""
    advice = _refusal(_geometry(8192, 1), n_ctx_train=2048)
    assert advice.startswith("the model was trained on 2048 tokens, the most one slot takes")
    assert "start with -c 8192 and no --rope-* flag: kvswap extends the context 4x" in advice
    assert (
        "llama-server extends it 2x with --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 2048 "
        "--override-kv llama.context_length=int:4096 -c 8192), or serve a model" in advice
    ), advice
    assert _geometry(8192, 1).n_ctx_slot(4096) > 2531  # extended, the slot holds the prompt
    # A split pool is told to unify it too; a per-slot cap above the training context does not
    # bind, the training context does.
    split = _refusal(_geometry(8192, 4), n_ctx_train=1024)
    assert "start with -c 8192 -kvu and no --rope-* flag" in split, split
    assert "--rope-scale 4" in split and "int:4096 -c 8192 -kvu)" in split, split
    assert _geometry(8192, 4, kvu=True).n_ctx_slot(4096) > 2531
    capped = _refusal(_geometry(8192, 1, per_slot=4096), n_ctx_train=2048)
    assert capped.startswith("the model was trained on 2048 tokens")
    # -c at its default, the training context: both bind, and a -c past it extends it.
    default = _refusal(_geometry(2048, 1), n_ctx_train=2048)
    assert "start with -c 4096 and no --rope-* flag: kvswap extends the context 2x" in default
    assert "int:4096 -c 4096)" in default, default


def test_a_slot_already_extended_names_the_models_own_training_context() -> None:
    """Slots extended 4x (-c 8192 over a model trained on 2048) and still too small: the
    advice counts from the model's 2,048 tokens, not the extended 8,192 (a YaRN over 8,192
    would be a 16x extension called 2x)."""
    message = exceeds_context_message(9000, 8192, _geometry(8192, 1), Trained(8192, "llama", 2048))
    advice = message.split(": ", 1)[1]
    assert advice.startswith("the model was trained on 2048 tokens, extended to 8192 by YaRN")
    assert "start with -c 16384 and no --rope-* flag: kvswap extends the context 8x" in advice
    assert "--rope-scale 8 --yarn-orig-ctx 2048" in advice, advice
