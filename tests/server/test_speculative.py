"""Speculative decoding through the real server: timings, /slots, /metrics and /props report
the draft; slot files carry the draft state (`.dft`) into a fresh server; a missing `.dft`
restores with a cold draft that is re-prefilled, with that cost reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

FIRST = chat_prompt(("user", "What is the capital of France?"))
BASE_ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")


def _draft_args() -> tuple[str, ...]:
    draft = tiny_model_path("llama", vocab="smollm2", n_embd=32, seed=3)
    return ("-md", str(draft), "--spec-type", "draft-simple", "-td", "1", "-tbd", "1")


def _run(server: ServerProcess, prompt: str, slot: int, n: int = 12) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "id_slot": slot}
    resp = server.post("/completion", {**body, "return_tokens": True})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _follow_up(first: dict) -> str:
    return (
        FIRST
        + first["content"]
        + "<|im_end|>\n<|im_start|>user\nAnd its population?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def save_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spec-slots")


def _server(server_factory, save_dir: Path, fresh: bool = False) -> ServerProcess:  # type: ignore[no-untyped-def]
    args = (*BASE_ARGS, *_draft_args(), "--slot-save-path", str(save_dir))
    return server_factory(*args, fresh=fresh)  # type: ignore[no-any-return]


def test_timings_slots_metrics_and_props_report_the_draft(server_factory, save_dir) -> None:  # type: ignore[no-untyped-def]
    plain: ServerProcess = server_factory(*BASE_ARGS)
    server = _server(server_factory, save_dir)
    ref = _run(plain, FIRST, slot=1)
    out = _run(server, FIRST, slot=1)
    assert out["tokens"] == ref["tokens"]
    t = out["timings"]
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert t["draft_prompt_n"] == t["prompt_n"]
    assert "draft_n" not in ref["timings"] and "draft_prompt_n" not in ref["timings"]
    assert out["generation_settings"]["speculative.types"] == "draft-simple"
    assert ref["generation_settings"]["speculative.types"] == "none"
    slots = server.client.get("/slots").json()
    assert all(s["speculative"] for s in slots)
    assert slots[1]["params"]["speculative.types"] == "draft-simple"  # the slot that ran FIRST
    props = server.client.get("/props").json()
    assert props["default_generation_settings"]["params"]["speculative.types"] == "draft-simple"

    assert not any(s["speculative"] for s in plain.client.get("/slots").json())
    metrics = server.metrics()
    assert metrics["llamacpp:spec_decode_num_draft_tokens_total"] >= t["draft_n"]
    assert metrics["llamacpp:spec_decode_num_drafts_total"] >= 1
    geometry = server.client.get("/props").json()["context_geometry"]
    assert geometry["draft"]["n_parallel"] == 2 and geometry["draft"]["cache_type_k"] == "f16"


def test_a_restored_mind_drafts_like_one_that_never_moved(server_factory, save_dir) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, save_dir)
    assert server.post("/slots/0?action=erase").status_code == 200
    first = _run(server, FIRST, slot=0)
    saved = server.post("/slots/0?action=save", {"filename": "mind.bin"})
    assert saved.status_code == 200, saved.text
    assert (save_dir / "mind.bin.dft").is_file()
    stayed = _run(server, _follow_up(first), slot=0)

    fresh = _server(server_factory, save_dir, fresh=True)
    try:
        restored = fresh.post("/slots/0?action=restore", {"filename": "mind.bin"})
        assert restored.status_code == 200, restored.text
        moved = _run(fresh, _follow_up(first), slot=0)
        assert moved["tokens"] == stayed["tokens"]
        tm, ts = moved["timings"], stayed["timings"]
        assert tm["draft_prompt_n"] <= tm["prompt_n"] + 1
        assert tm["draft_prompt_n"] == ts["draft_prompt_n"]
        assert (tm["draft_n"], tm["draft_n_accepted"]) == (ts["draft_n"], ts["draft_n_accepted"])

        # Without its .dft the file still restores; the draft is cold and re-prefilled.
        (save_dir / "mind.bin.dft").unlink()
        restored = fresh.post("/slots/1?action=restore", {"filename": "mind.bin"})
        assert restored.status_code == 200, restored.text
        assert "cold draft" in fresh.log()
        cold = _run(fresh, _follow_up(first), slot=1)
        assert cold["tokens"] == stayed["tokens"]
        n_follow = cold["timings"]["cache_n"] + cold["timings"]["prompt_n"]
        assert cold["timings"]["draft_prompt_n"] == n_follow  # the whole prompt, reported

        # A torn .dft (cut short after the save) is refused by its checksum: cold, never applied.
        assert fresh.post("/slots/1?action=save", {"filename": "torn.bin"}).status_code == 200
        dft = save_dir / "torn.bin.dft"
        dft.write_bytes(dft.read_bytes()[:-100])
        restored = fresh.post("/slots/0?action=restore", {"filename": "torn.bin"})
        assert restored.status_code == 200, restored.text
        assert "torn.bin.dft" in fresh.log() and "cold draft" in fresh.log()
        again = _run(fresh, _follow_up(first), slot=0)
        assert again["tokens"] == stayed["tokens"]
    finally:
        fresh.stop()


def test_ngram_simple_drafts_from_a_prompt_that_quotes_itself(server_factory) -> None:  # type: ignore[no-untyped-def]
    quoting = chat_prompt(
        ("user", "Repeat after me, word for word: one two three four five six seven eight."),
        ("assistant", "one two three four five six seven eight."),
        ("user", "Again, the same words."),
    )
    plain: ServerProcess = server_factory(*BASE_ARGS)
    ngram: ServerProcess = server_factory(
        *BASE_ARGS,
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "3",
        "--spec-ngram-simple-size-m",
        "8",
    )
    ref = _run(plain, quoting, slot=0, n=12)
    out = _run(ngram, quoting, slot=0, n=12)
    assert out["tokens"] == ref["tokens"]
    assert out["timings"]["draft_n_accepted"] > 0


def test_a_reconfigure_keeps_each_resident_draft_warm(server_factory) -> None:  # type: ignore[no-untyped-def]
    # One KV stream per slot: going from 2 to 3 slots rewrites the target's and the draft's
    # stream headers; the resident mind then drafts without re-prefilling its draft.
    server: ServerProcess = server_factory(*BASE_ARGS, *_draft_args(), fresh=True)
    try:
        first = _run(server, FIRST, slot=0)
        resp = server.post("/reconfigure", {"n_parallel": 3})
        assert resp.status_code == 200, resp.text
        assert "cold draft" not in server.log()
        nxt = _run(server, _follow_up(first), slot=0)
        t = nxt["timings"]
        assert t["draft_prompt_n"] <= t["prompt_n"] + 1 and t["draft_n"] > 0
        refused = server.post("/reconfigure", {"cache_type_k_draft": "q8_0"})
        assert refused.status_code == 400 and "draft" in refused.json()["error"]["message"]
    finally:
        server.stop()


def test_streamed_drafts_concatenate_to_the_whole_and_sampling_works(
    server_factory, save_dir
) -> None:  # type: ignore[no-untyped-def]
    server = _server(server_factory, save_dir)
    body = {"prompt": FIRST, "n_predict": 16, "temperature": 0, "id_slot": 1}
    whole = server.post("/completion", body).json()
    chunks = list(server.stream("/completion", {**body, "stream": True}))
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert chunks[-1]["timings"]["draft_n"] == whole["timings"]["draft_n"]
    # Sampling at a temperature verifies drafts row by row with the request's own chain.
    hot = server.post("/completion", {**body, "temperature": 0.9, "seed": 7})
    assert hot.status_code == 200, hot.text
    out = hot.json()
    assert 1 <= out["tokens_predicted"] <= 16 and out["timings"]["draft_n"] > 0


def test_a_draft_with_another_vocabulary_is_refused_at_start_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    draft = tiny_model_path("llama", seed=5)  # the tiny 384-token vocabulary, not SmolLM2's
    cmd = [sys.executable, "-m", "kvswap", "serve", "-c", "512", "-np", "1", "--port", "0"]
    cmd += ["-md", str(draft), "--spec-type", "draft-simple"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "vocabulary" in proc.stdout + proc.stderr
