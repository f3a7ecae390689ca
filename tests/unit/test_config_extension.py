"""kvswap's own context extension (`config.extension`): YaRN exactly where the flags give a
slot more than the training context, never over a setting the user or the model made, and the
RoPE setting recorded in what a page's model fingerprint says."""

from __future__ import annotations

from kvswap.config.extension import Extension, auto_extension, rope_fingerprint, yarn_factor
from kvswap.config.flags import parse_serve_args


def _auto(n_ctx_slot: int, *, rope: tuple[tuple[str, float], ...] = (), scaling: str | None = None):
    return auto_extension(rope=rope, n_ctx_slot=n_ctx_slot, n_ctx_train=8192, model_scaling=scaling)


def test_slots_within_the_training_context_are_not_extended() -> None:
    assert _auto(4096) is None
    assert _auto(8192) is None  # -c's default: nothing changes for anyone who did not ask


def test_a_larger_slot_gets_the_smallest_power_of_two_that_holds_it() -> None:
    assert _auto(8193) == Extension(2, 8192)
    assert _auto(16384) == Extension(2, 8192)
    assert _auto(20000) == Extension(4, 8192)
    assert _auto(32768) == Extension(4, 8192)
    assert _auto(131072) == Extension(16, 8192)
    assert Extension(4, 8192).n_ctx_train == 32768
    assert yarn_factor(8192, 8192) == 2  # an extension is at least 2x


def test_a_rope_flag_or_a_models_own_scaling_keeps_the_setting_as_given() -> None:
    """`--rope-scaling none` is how a user keeps llama-server's cap; any other RoPE flag is a
    setting of their own, and a model whose metadata scales its RoPE (Llama 3.1's, Qwen's YaRN)
    already says how far it goes."""
    for args in (["--rope-scaling", "none"], ["--rope-freq-base", "20000"], ["--rope-scale", "2"]):
        rope = parse_serve_args(args, {}).context.rope
        assert rope and _auto(32768, rope=rope) is None, args
    assert _auto(32768, scaling="llama3") is None
    assert _auto(32768, scaling="yarn") is None
    assert _auto(32768, scaling="none") == Extension(4, 8192)


def test_the_extension_sets_what_llama_servers_flags_set() -> None:
    """The same context parameters as `--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx
    8192`, with libllama's integer fields as integers (ctypes refuses a float there)."""
    flags = parse_serve_args(
        ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "8192"], {}
    ).context.rope
    assert dict(Extension(4, 8192).rope) == dict(flags)
    types = {name: type(value) for name, value in Extension(4, 8192).rope}
    assert types == {"rope_scaling_type": int, "rope_freq_scale": float, "yarn_orig_ctx": int}


def test_a_pages_model_fingerprint_records_the_rope_setting() -> None:
    """A state made under one RoPE setting does not load under another (its keys were rotated
    by other frequencies); with no setting the fingerprint is the model's own, so files written
    before the setting was recorded still match."""
    assert rope_fingerprint("abc", ()) == "abc"
    x2, x4 = (
        rope_fingerprint("abc", Extension(2, 8192).rope),
        rope_fingerprint("abc", Extension(4, 8192).rope),
    )
    assert x2 != x4 and x2.startswith("abc;rope=")
    shuffled = tuple(reversed(Extension(4, 8192).rope))
    assert rope_fingerprint("abc", shuffled) == x4
