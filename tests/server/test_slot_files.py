"""Slot files: save/erase/restore keeps a mind whole, and files interoperate with libllama's
own `llama_state_seq_save_file` / `llama_state_seq_load_file` in both directions."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from kvswap.backend.batch import Batch
from kvswap.backend.context import Context, ContextParams
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

PROMPT = chat_prompt(("user", "Describe the sea in two sentences."))


def _greedy(server: ServerProcess, prompt: str | list[int], n: int, slot: int) -> dict:
    return server.post(
        "/completion",
        {
            "prompt": prompt,
            "n_predict": n,
            "temperature": 0,
            "id_slot": slot,
            "return_tokens": True,
        },
    ).json()


def test_save_erase_restore_into_another_slot_continues_as_if_it_never_moved(
    small_server: ServerProcess,
) -> None:
    first = _greedy(small_server, PROMPT, 12, slot=0)
    saved = small_server.post("/slots/0?action=save", {"filename": "mind-a.bin"}).json()
    assert saved["n_saved"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert saved["n_written"] > 0
    assert small_server.post("/slots/0?action=erase").json()["n_erased"] == saved["n_saved"]
    restored = small_server.post("/slots/2?action=restore", {"filename": "mind-a.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]

    follow = (
        PROMPT
        + first["content"]
        + "<|im_end|>\n<|im_start|>user\nNow one more.<|im_end|>\n<|im_start|>assistant\n"
    )
    n_follow = len(
        small_server.post("/tokenize", {"content": follow, "add_special": True}).json()["tokens"]
    )
    moved = _greedy(small_server, follow, 12, slot=2)
    assert moved["timings"]["cache_n"] == saved["n_saved"]
    assert moved["timings"]["prompt_n"] == n_follow - saved["n_saved"]

    # The same two turns on a slot that never moved.
    _greedy(small_server, PROMPT, 12, slot=3)
    never_moved = _greedy(small_server, follow, 12, slot=3)
    assert never_moved["timings"]["cache_n"] == moved["timings"]["cache_n"]
    assert moved["tokens"] == never_moved["tokens"]
    assert moved["content"] == never_moved["content"]


def _context_like_small_server(smollm2) -> Context:  # type: ignore[no-untyped-def]
    # The server runs -c 4096 -np 4 without unified KV: 4 streams (a state records them).
    return Context(
        smollm2,
        ContextParams(
            n_ctx=4096,
            n_seq_max=4,
            n_batch=512,
            n_ubatch=128,
            kv_unified=False,
            n_threads=2,
            n_threads_batch=2,
        ),
    )


def _logits_argmax_after_redecoding_last(ctx: Context, tokens: list[int]) -> int:
    """Drop the last cached position and decode that token again: the next token's argmax."""
    last = len(tokens) - 1
    assert ctx.seq_rm(0, last, -1)
    batch = Batch(8)
    batch.add_span(np.array([tokens[last]], dtype=np.int32), last, 0, True)
    assert ctx.decode(batch) == 0
    out = int(np.argmax(ctx.logits(0)))
    batch.close()
    return out


def test_a_kvswap_file_loads_with_llama_state_seq_load_file(
    small_server: ServerProcess, save_dir: Path, smollm2
) -> None:  # type: ignore[no-untyped-def]
    result = _greedy(small_server, PROMPT, 3, slot=1)
    saved = small_server.post("/slots/1?action=save", {"filename": "for-libllama.bin"}).json()
    ctx = _context_like_small_server(smollm2)
    try:
        cap = 4096
        out = (llama_cpp.llama_token * cap)()
        n_out = ctypes.c_size_t(0)
        n_read = llama_cpp.llama_state_seq_load_file(
            ctx.ptr, str(save_dir / "for-libllama.bin").encode(), 0, out, cap, ctypes.byref(n_out)
        )
        assert n_read > 0
        packed = list(out[: n_out.value])
        # llama-server's packed token list: [-1, version 1, n, tokens..., n_media 0].
        assert packed[:2] == [-1, 1] and packed[2] == saved["n_saved"] and packed[-1] == 0
        tokens = packed[3:-1]
        assert tokens[-2:] == result["tokens"][:2]  # prompt + the first two generated tokens
        assert ctx.seq_pos_max(0) == len(tokens) - 1
        assert _logits_argmax_after_redecoding_last(ctx, tokens) == result["tokens"][2]
    finally:
        ctx.close()


def test_a_llama_state_seq_save_file_file_restores_in_kvswap(
    small_server: ServerProcess, save_dir: Path, smollm2
) -> None:  # type: ignore[no-untyped-def]
    tokens = [
        int(t)
        for t in smollm2.vocab.tokenize(
            chat_prompt(("user", "What is the capital of Japan?")), True, True
        )
    ]
    ctx = _context_like_small_server(smollm2)
    try:
        batch = Batch(len(tokens))
        batch.add_span(np.array(tokens, dtype=np.int32), 0, 0, True)
        assert ctx.decode(batch) == 0
        expected_next = int(np.argmax(ctx.logits(len(tokens) - 1)))
        batch.close()
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        path = save_dir / "from-libllama.bin"
        assert (
            llama_cpp.llama_state_seq_save_file(ctx.ptr, str(path).encode(), 0, arr, len(tokens))
            > 0
        )
    finally:
        ctx.close()
    restored = small_server.post(
        "/slots/3?action=restore", {"filename": "from-libllama.bin"}
    ).json()
    assert restored["n_restored"] == len(tokens)
    # The same prompt: only its last token is evaluated, and greedy picks the same next token.
    result = _greedy(small_server, tokens, 1, slot=3)
    assert result["timings"]["cache_n"] == len(tokens) - 1 and result["timings"]["prompt_n"] == 1
    assert result["tokens"] == [expected_next]


def test_restore_refuses_a_torn_file_and_leaves_the_slot_usable(
    small_server: ServerProcess, save_dir: Path
) -> None:
    _greedy(small_server, PROMPT, 2, slot=0)
    small_server.post("/slots/0?action=save", {"filename": "torn.bin"})
    path = save_dir / "torn.bin"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    resp = small_server.post("/slots/0?action=restore", {"filename": "torn.bin"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    # Nothing was applied: the slot still reuses its cache.
    again = _greedy(small_server, PROMPT, 2, slot=0)
    assert again["timings"]["prompt_n"] == 1


def test_a_symlink_planted_in_the_save_path_is_never_followed(
    small_server: ServerProcess, save_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    (save_dir / "planted.bin").symlink_to(outside)
    _greedy(small_server, PROMPT, 2, slot=0)
    save = small_server.post("/slots/0?action=save", {"filename": "planted.bin"})
    assert save.status_code == 400, save.text
    restore = small_server.post("/slots/0?action=restore", {"filename": "planted.bin"})
    assert restore.status_code == 400, restore.text
    assert outside.read_bytes() == b"precious"
