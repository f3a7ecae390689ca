"""POST /minds/{name}?action=...: a mind moves between its slot, RAM and disk without a request,
and comes back whole (its next turn prefills only the new tokens); drop ends it everywhere; a
tenant can neither see nor move another tenant's mind.

A real server (SmolLM2, one thread, a real save path); what each move did is read from the
places a user sees it: /pages, the files under the save path, and the next turn's timings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvswap.core.keys import PUBLIC_NAMESPACE, mind_key
from kvswap.tiers.mindfiles import MINDS_DIR, file_name
from tests.server.harness import ServerProcess, chat_prompt

pytestmark = pytest.mark.model

ARGS = ("-c", "2048", "-np", "2", "-t", "1", "-tb", "1", "-ub", "128", "--metrics")
KA, KB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}


class Mind:
    """One conversation named `name`, turn after turn."""

    def __init__(self, server: ServerProcess, name: str, headers: dict[str, str]) -> None:
        self.server, self.name, self.headers = server, name, headers
        self.prompt = chat_prompt(
            ("system", f"You are {name}. You answer in one short sentence. " * 5),
            ("user", "Name a river."),
        )
        self.n_had = 0  # the tokens the mind held after its last turn

    def turn(self) -> dict[str, Any]:
        body = {"prompt": self.prompt, "n_predict": 6, "temperature": 0, "mind": self.name}
        resp = self.server.post("/completion", body, headers=self.headers)
        assert resp.status_code == 200, resp.text
        out = dict(resp.json())
        timings = out["timings"]
        self.n_had = timings["cache_n"] + timings["prompt_n"]
        self.prompt += out["content"] + "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
        self.prompt += "<|im_start|>assistant\n"
        return out

    def act(self, action: str, headers: dict[str, str] | None = None) -> Any:
        return self.server.client.post(
            f"/minds/{self.name}?action={action}",
            headers=self.headers if headers is None else headers,
        )

    def tier(self) -> str:
        minds = self.server.client.get("/pages", headers=self.headers).json()["minds"]
        return next((m["tier"] for m in minds if m["mind"] == self.name), "none")

    def files(self, save: Path) -> list[str]:
        """The files of this mind under the save path."""
        stem = file_name(mind_key(PUBLIC_NAMESPACE, self.name))
        return [p.name for p in (save / MINDS_DIR).iterdir() if p.name.startswith(stem)]


def _moved(mind: Mind, action: str, tier: str) -> None:
    resp = mind.act(action)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"mind": mind.name, "action": action, "tier": tier}
    assert mind.tier() == tier  # /pages agrees


def test_a_mind_moves_between_the_tiers_and_comes_back_whole(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    save = tmp_path / "slots"
    save.mkdir()
    server = start(*ARGS, "--slot-save-path", str(save), "--page-flush-seconds", "0")
    ann = Mind(server, "ann", {})
    ann.turn()
    assert ann.tier() == "slot"
    for action, tier in [("page_out", "ram"), ("page_in", "slot"), ("page_out", "ram")]:
        _moved(ann, action, tier)
    had = ann.n_had
    assert ann.turn()["timings"]["cache_n"] >= had - 1  # from RAM: only the new turn prefilled

    _moved(ann, "spill", "disk")  # from its slot straight to disk
    assert ann.files(save), "no file was written"
    hits_disk = server.metrics()["llamacpp:mind_hits_disk_total"]
    _moved(ann, "page_in", "slot")  # read back from disk into a slot
    assert server.metrics()["llamacpp:mind_hits_disk_total"] == hits_disk + 1
    had = ann.n_had
    assert ann.turn()["timings"]["cache_n"] >= had - 1

    _moved(ann, "drop", "none")
    assert ann.files(save) == []
    new = server.metrics()["llamacpp:mind_new_total"]
    ann.turn()  # a dropped mind starts anew
    assert server.metrics()["llamacpp:mind_new_total"] == new + 1


def test_bad_actions_and_unknown_minds_are_typed_errors(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*ARGS)  # no save path: no disk tier
    bob = Mind(server, "bob", {})
    bob.turn()
    assert bob.act("explode").status_code == 400
    assert bob.act("spill").status_code == 501  # names --slot-save-path
    assert "--slot-save-path" in bob.act("spill").json()["error"]["message"]
    assert server.client.post("/minds/nobody?action=page_out").status_code == 404
    assert bob.tier() == "slot"  # nothing moved


def test_another_tenant_can_neither_see_nor_move_a_mind(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(*ARGS, "--api-key", "ka,kb")
    zed = Mind(server, "zed", KA)
    zed.turn()
    for action in ("page_out", "page_in", "drop"):
        resp = zed.act(action, headers=KB)
        assert resp.status_code == 404, resp.text
        assert "zed" not in server.client.get("/pages", headers=KB).text
    assert zed.tier() == "slot"  # kb's tries changed nothing
    assert zed.act("page_out", headers={}).status_code == 401
    _moved(zed, "page_out", "ram")
