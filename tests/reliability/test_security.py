"""Security through a real server: keys on every route the app describes, the loopback default,
and typed limits on request bodies and on `n_predict`.

The route list is the server's own OpenAPI document, so routes other branches add (LoRA
adapters, /v1/messages, /v1/responses, minds) are covered once merged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from kvswap.tiny import tiny_model_path
from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model

PUBLIC = {"/health", "/v1/health"}
MAX_BODY = 4096
MAX_N_PREDICT = 8


@pytest.fixture(scope="module")
def keyed(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("from-file\n")
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    server = server_factory(
        "-m", str(model), "-c", "1024", "-np", "2", "-t", "1", "-tb", "1", "--metrics",
        "--api-key", "k1,k2", "--api-key-file", str(keys),
        "--max-body-bytes", str(MAX_BODY), "--max-n-predict", str(MAX_N_PREDICT),
        save_path=True,
    )  # fmt: skip
    server.client.headers["Authorization"] = "Bearer k2"
    return server


def _operations(server: ServerProcess) -> Iterator[tuple[str, str]]:
    document = server.client.get("/openapi.json").json()
    for path, ops in document["paths"].items():
        for method in ops:
            yield method.upper(), re.sub(r"\{[^}]+\}", "0", path)


def test_every_described_route_but_health_needs_a_key(keyed: ServerProcess) -> None:
    anonymous = httpx.Client(base_url=keyed.url, timeout=60)
    operations = sorted(set(_operations(keyed)))
    assert len(operations) > 20
    for method, path in operations:
        for headers in ({}, {"Authorization": "Bearer k3"}, {"X-Api-Key": "k1x"}):
            resp = anonymous.request(method, path, json={"prompt": "hi"}, headers=headers)
            if path in PUBLIC:
                assert resp.status_code == 200, (method, path)
                continue
            assert resp.status_code == 401, (method, path, headers, resp.text)
            assert resp.json()["error"]["type"] == "authentication_error"
    # The document itself is a route too.
    assert anonymous.get("/openapi.json").status_code == 401


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer k1"}, {"X-Api-Key": "from-file"}])
def test_each_configured_key_opens_every_route(keyed: ServerProcess, headers: dict) -> None:
    with httpx.Client(base_url=keyed.url, timeout=60, headers=headers) as client:
        assert client.get("/props").status_code == 200
        assert client.post("/tokenize", json={"content": "hi"}).status_code == 200


def test_the_server_listens_on_loopback_only_by_default(keyed: ServerProcess) -> None:
    listening = [
        c.laddr
        for c in psutil.Process(keyed.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


def _assert_typed(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status and err["type"] == "invalid_request_error"


def test_a_body_past_the_limit_is_a_typed_413(keyed: ServerProcess) -> None:
    big = b'{"prompt": "' + b"a" * MAX_BODY + b'"}'
    _assert_typed(keyed.client.post("/completion", content=big), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
        yield b'{"prompt": "'
        for _ in range(8):
            yield b"a" * 1024
        yield b'"}'

    _assert_typed(keyed.client.post("/completion", content=chunks()), 413)
    ok = keyed.client.post("/completion", json={"prompt": "hi", "n_predict": 1})
    assert ok.status_code == 200


@pytest.mark.parametrize("field", ["n_predict", "max_tokens"])
def test_n_predict_past_the_limit_is_a_typed_400(keyed: ServerProcess, field: str) -> None:
    route = "/completion" if field == "n_predict" else "/v1/completions"
    resp = keyed.client.post(route, json={"prompt": "hi", field: MAX_N_PREDICT + 1})
    _assert_typed(resp, 400)
    assert str(MAX_N_PREDICT) in resp.json()["error"]["message"]


def test_an_unbounded_request_is_capped_at_the_limit(keyed: ServerProcess) -> None:
    body = {"prompt": "hi", "n_predict": -1, "ignore_eos": True}
    out = keyed.client.post("/completion", json=body).json()
    assert out["tokens_predicted"] == MAX_N_PREDICT


def test_a_filename_escaping_the_save_path_is_refused(keyed: ServerProcess) -> None:
    save_dir = Path(keyed.args[keyed.args.index("--slot-save-path") + 1])
    resp = keyed.client.post("/slots/0?action=save", json={"filename": "../../escape.bin"})
    _assert_typed(resp, 400)
    assert not (save_dir.parent.parent / "escape.bin").exists()
