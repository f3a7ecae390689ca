"""Every tiny architecture loads in the real libllama and decodes deterministically.

Uses the low-level `llama_cpp` API directly (for now: kvswap.backend is the only package code
that may import it). libllama's log lines are already routed below WARNING by the session
fixture in tests/conftest.py; installing a second callback here would replace that router for
every test that runs after this file. One thread per context: the suite fits 2 cores.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from kvswap.tiny import ARCH_NAMES, realistic_kv_params, tiny_model_path
from kvswap.tiny.vocab import smollm2_gguf_path

L = pytest.importorskip("llama_cpp")

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

# 39 tokens with the tiny vocabulary (its merges come from similar text).
PROMPT = (
    "The server keeps the cache in memory and writes the oldest pages to the disk. "
    "Hello, world! What is the time?"
)
N_GEN = 8
RECURRENT = {"mamba", "mamba2", "rwkv6", "rwkv7"}
HYBRID = {"lfm2", "granitehybrid", "jamba", "qwen35"}


@contextmanager
def loaded(path: Path, *, vocab_only: bool = False) -> Iterator[object]:
    params = L.llama_model_default_params()
    params.vocab_only = vocab_only
    model = L.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"{path.name} did not load"
    try:
        yield model
    finally:
        L.llama_model_free(model)


@contextmanager
def context(model: object, n_ctx: int = 256) -> Iterator[object]:
    params = L.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = min(n_ctx, 256)
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, params)
    assert ctx, "context creation failed"
    try:
        yield ctx
    finally:
        L.llama_free(ctx)


def tokenize(model: object, text: str, *, add_special: bool = False) -> list[int]:
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    vocab = L.llama_model_get_vocab(model)
    n = L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, True)
    assert n >= 0
    return list(buf[:n])


def detokenize(model: object, tokens: list[int]) -> bytes:
    vocab, out = L.llama_model_get_vocab(model), b""
    buf = ctypes.create_string_buffer(256)
    for token in tokens:
        n = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
        assert n >= 0
        out += buf.raw[:n]
    return out


def greedy(model: object, prompt: list[int], n_gen: int = N_GEN) -> list[int]:
    """Decode `prompt` in one batch in a fresh context, then take `n_gen` argmax tokens."""
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out: list[int] = []
    with context(model) as ctx:
        batch = L.llama_batch_init(len(prompt), 0, 1)
        try:
            tokens, pos = prompt, 0
            while len(out) < n_gen:
                batch.n_tokens = len(tokens)
                for i, token in enumerate(tokens):
                    batch.token[i], batch.pos[i] = token, pos + i
                    batch.n_seq_id[i], batch.seq_id[i][0] = 1, 0
                    batch.logits[i] = i == len(tokens) - 1
                assert L.llama_decode(ctx, batch) == 0
                pos += len(tokens)
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                assert np.isfinite(logits).all()
                tokens = [int(np.argmax(logits))]
                out.append(tokens[0])
        finally:
            L.llama_batch_free(batch)
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_loads_and_greedy_decodes_deterministically(arch: str, dtype: str) -> None:
    with loaded(tiny_model_path(arch, dtype=dtype)) as model:
        assert L.llama_model_is_recurrent(model) == (arch in RECURRENT)
        assert L.llama_model_is_hybrid(model) == (arch in HYBRID)
        prompt = tokenize(model, PROMPT)
        assert 35 <= len(prompt) <= 45
        first = greedy(model, prompt)
        assert greedy(model, prompt) == first
        assert len(first) == N_GEN and all(0 <= t < 384 for t in first)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "mamba", "rwkv7", "qwen35"])
def test_clean_text_generates_printable_utf8(arch: str) -> None:
    with loaded(tiny_model_path(arch, clean_text=True)) as model:
        text = detokenize(model, greedy(model, tokenize(model, PROMPT), n_gen=32))
    decoded = text.decode("utf-8")  # strict: no lone bytes, no partial sequences
    assert all(ch.isprintable() or ch in "\n\t" for ch in decoded), decoded


TOKENIZER_TEXTS = [
    PROMPT,
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "def f(x):\n    return x ** 2  # 1234567890",
    "Ünïcödé — café, naïve, 日本語, emoji 🦙👍🏽",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]


def test_smollm2_vocab_tokenizes_like_smollm2() -> None:
    tiny = tiny_model_path("llama", vocab="smollm2", n_embd=32, dtype="f16")
    with loaded(smollm2_gguf_path(), vocab_only=True) as real, loaded(tiny) as model:
        for text in TOKENIZER_TEXTS:
            for add_special in (False, True):
                expected = tokenize(real, text, add_special=add_special)
                assert tokenize(model, text, add_special=add_special) == expected, text
        first = greedy(model, tokenize(model, PROMPT))
        assert greedy(model, tokenize(model, PROMPT)) == first


def test_realistic_kv_model_has_smollm2_bytes_per_token() -> None:
    path = tiny_model_path("llama", dtype="f16", **realistic_kv_params("smollm2-135m"))
    assert path.stat().st_size < 1_000_000
    with loaded(path) as model, context(model) as ctx:
        assert L.llama_model_n_layer(model) == 30
        batch = L.llama_batch_init(128, 0, 1)
        sizes = []
        try:
            for start in (0, 64):
                batch.n_tokens = 64
                for i in range(64):
                    batch.token[i], batch.pos[i] = 3 + (start + i) % 256, start + i
                    batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, 0, i == 63
                assert L.llama_decode(ctx, batch) == 0
                sizes.append(L.llama_state_seq_get_size(ctx, 0))
        finally:
            L.llama_batch_free(batch)
    per_token = (sizes[1] - sizes[0]) / 64
    # 2 (K, V) * 30 layers * 3 heads * 64 * 2 bytes, plus libllama's per-cell metadata.
    assert 23_040 <= per_token <= 23_040 + 16


def test_long_training_context() -> None:
    with loaded(tiny_model_path("llama", n_ctx_train=32768)) as model:
        assert L.llama_model_n_ctx_train(model) == 32768
        with context(model, n_ctx=32768) as ctx:
            assert L.llama_n_ctx(ctx) == 32768
