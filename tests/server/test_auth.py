"""--api-key guards every route but /health; the key goes in Authorization or X-Api-Key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.harness import ServerProcess

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def keyed_server(server_factory, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:  # type: ignore[no-untyped-def]
    key_file: Path = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("file-key\n")
    return server_factory(
        "-c",
        "512",
        "-np",
        "1",
        "-t",
        "1",
        "--api-key",
        "k1,k2",
        "--api-key-file",
        str(key_file),
        "--metrics",
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/props"),
        ("GET", "/slots"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("POST", "/completion"),
        ("POST", "/tokenize"),
        ("GET", "/lora-adapters"),
        ("POST", "/lora-adapters"),
    ],
)
def test_every_route_but_health_needs_a_key(
    keyed_server: ServerProcess, method: str, path: str
) -> None:
    resp = keyed_server.client.request(
        method, path, json={"prompt": "hi", "content": "hi", "n_predict": 1}
    )
    assert resp.status_code == 401
    assert resp.json()["error"] == {
        "code": 401,
        "message": "Invalid API Key",
        "type": "authentication_error",
    }
    wrong = keyed_server.client.request(
        method, path, json={"prompt": "hi"}, headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer k1"},
        {"Authorization": "Bearer k2"},
        {"X-Api-Key": "file-key"},
        {"Authorization": "k2"},
    ],
)
def test_any_configured_key_works(keyed_server: ServerProcess, headers: dict[str, str]) -> None:
    resp = keyed_server.client.post("/tokenize", json={"content": "hi"}, headers=headers)
    assert resp.status_code == 200


def test_health_is_public(keyed_server: ServerProcess) -> None:
    assert keyed_server.client.get("/health").status_code == 200
    assert keyed_server.client.get("/v1/health").status_code == 200
