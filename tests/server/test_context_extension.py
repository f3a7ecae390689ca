"""A slot past the model's training context (`config.extension`): a `-c` that asks for it is
served by YaRN with no other flag, exactly as llama-server's four flags for the same extension
serve it; `--rope-scaling none` keeps llama-server's cap; a prompt too long is told the `-c`
that holds it; and a mind made under one RoPE setting is never served under another.

The tiny model is trained on 4,096 tokens.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

LONG = {"prompt": "one two three four five six " * 300, "n_predict": 6, "temperature": 0}


def _base() -> list[str]:
    model = str(tiny_model_path("llama", seed=7, vocab="tiny"))
    return ["-m", model, "-np", "1", "-t", "1", "-tb", "1", "-ub", "512"]


def _served(args: list[str], log: Path, body: dict[str, Any]) -> tuple[dict[str, Any], str, int]:
    """One request on a server started with `args`: its answer, the server's log, its slot."""
    server = ServerProcess(args, log)
    try:
        n_ctx_slot = server.client.get("/props").json()["context_geometry"]["n_ctx_slot"]
        resp = server.post("/completion", body)
        out: dict[str, Any] = resp.json()
        out["status"] = resp.status_code
        return out, server.log(), n_ctx_slot
    finally:
        server.stop()


def test_a_larger_c_is_served_by_yarn_as_llama_servers_flags_serve_it(tmp_path: Path) -> None:
    """Before: a slot stayed at 4,096 whatever -c said, and the refusal named four flags."""
    refused, _, n_plain = _served(_base(), tmp_path / "plain.log", LONG)
    message = refused["error"]["message"]
    assert refused["status"] == 400 and n_plain == 4096, refused
    assert "trained on 4096 tokens" in message, message
    ours = re.search(r"start with (-c \d+) and no --rope-\* flag", message)
    theirs = re.search(r"llama-server extends it 2x with (--rope-scaling .*?)\), or serve", message)
    assert ours is not None and theirs is not None, message

    answer, log, n_slot = _served([*_base(), *ours[1].split()], tmp_path / "ours.log", LONG)
    assert answer["status"] == 200 and n_slot == 8192, answer
    assert answer["tokens_evaluated"] > 5000
    assert "YaRN extends it 2x to 8192" in log and "--rope-scaling none keeps" in log, log
    # llama-server's flags for the same extension: the same RoPE, so the same greedy answer.
    same, log, n_slot = _served([*_base(), *theirs[1].split()], tmp_path / "theirs.log", LONG)
    assert same["status"] == 200 and n_slot == 8192, same
    assert same["content"] == answer["content"] and same["tokens_predicted"] == 6
    assert "YaRN extends" not in log  # the user's own setting: nothing added to it
    # --rope-scaling none: llama-server's cap, whatever -c says.
    capped, _, n_slot = _served(
        [*_base(), "-c", "8192", "--rope-scaling", "none"], tmp_path / "none.log", LONG
    )
    assert capped["status"] == 400 and n_slot == 4096, capped


def _mind_turn(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    resp = server.post("/completion", body, headers={"X-Mind-Id": "agent"})
    out: dict[str, Any] = resp.json()
    out["status"] = resp.status_code
    return out


def test_a_mind_made_under_another_rope_setting_is_refused_and_kept(tmp_path: Path) -> None:
    """A mind's keys were rotated by its server's RoPE: under another setting they are another
    function's state. A restart at the default -c refuses the mind made under YaRN (naming the
    setting), keeps its file, and the server with the mind's setting serves it from disk."""
    save = tmp_path / "save"
    save.mkdir()
    args = [*_base(), "--slot-save-path", str(save)]
    body = {"prompt": "The agent reads the repository. " * 40, "n_predict": 4, "temperature": 0}
    server = ServerProcess([*args, "-c", "8192"], tmp_path / "yarn.log")
    try:
        made = _mind_turn(server, body)
        assert made["status"] == 200, made
        spill = server.post("/minds/agent?action=spill")
        assert spill.status_code == 200 and spill.json()["tier"] == "disk", spill.text
    finally:
        server.stop()
    n_tokens = made["tokens_evaluated"] + made["tokens_predicted"] - 1

    server = ServerProcess(args, tmp_path / "plain.log")
    try:
        refused = _mind_turn(server, {**body, "prompt": body["prompt"] + "Then?"})
        assert refused["status"] == 400, refused
        assert "the RoPE setting rope_freq_scale=0.5" in refused["error"]["message"], refused
        assert "its file is kept" in refused["error"]["message"]
    finally:
        server.stop()

    server = ServerProcess([*args, "-c", "8192"], tmp_path / "again.log")
    try:
        back = _mind_turn(server, {**body, "prompt": body["prompt"] + "Then?"})
        assert back["status"] == 200, back
        assert back["mind"]["tier_before"] == "disk" and back["mind"]["n_tokens_before"] == n_tokens
    finally:
        server.stop()
