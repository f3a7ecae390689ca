"""Property-based fuzzing of every route in the server's own OpenAPI description.

For each operation the live server publishes, hypothesis draws requests (see `openapi_cases`)
and checks what a client relies on: never a 500, every error in the typed shape with the HTTP
status equal to its `code`, every SSE event valid JSON, and the server alive (GET /health) after
each case. At the end no slot is left busy and nothing was written outside the save path.

`KVSWAP_FUZZ_EXAMPLES` (default 12) sets the cases per operation; CI runs the default, a deeper
run is `KVSWAP_FUZZ_EXAMPLES=300 pytest tests/reliability/test_fuzz_routes.py`.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from kvswap.core.errors import ErrorKind
from kvswap.tiny import tiny_model_path
from tests.reliability.openapi_cases import Case, Fuzzer
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(1500)]

N_EXAMPLES = int(os.environ.get("KVSWAP_FUZZ_EXAMPLES", "12"))
ONLY = re.compile(os.environ.get("KVSWAP_FUZZ_ONLY", ""))
ERROR_TYPES = {kind.value for kind in ErrorKind}

HINTS: dict[str, tuple[object, ...]] = {
    "action": ("save", "restore", "erase", "page_out", "page_in", "spill", "page_drop"),
    "page": ("p0", "p1", "..", "a/b", "x" * 300, "nul\x00"),
    "filename": ("f0.bin", "f1.bin", "../up.bin", "/etc/passwd", "a\x00b", "link.bin", ".lock"),
    "id_slot": (0, 1, 2, -1, 99),
    "n_predict": (0, 1, 4, 8, -1),
    "max_tokens": (1, 4),
    "prompt": ("hello", [3, 4, 5], ""),
    "content": ("hello", ""),
    "tokens": ([3, 4, 5], [2**31 - 1]),
    "messages": ([{"role": "user", "content": "hi"}],),
    "cache_type_k": ("f16", "q8_0"),
    "cache_type_v": ("f16", "q8_0"),
}
# Keep live reconfigures to pools this shared machine can build in milliseconds; out-of-range
# values (a 1e9-token pool) are refused by a memory check the unit tests cover.
CAPS = {"n_ctx": (1, 4096), "n_batch": (1, 4096), "n_ubatch": (1, 4096), "n_parallel": (1, 8)}


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "slots").mkdir()
    (root / "outside.bin").write_bytes(b"not a slot file")
    # A symlink placed in the save path that points out of it.
    (root / "slots" / "link.bin").symlink_to(root / "outside.bin")
    return root


@pytest.fixture(scope="module")
def fuzz_server(server_factory: Callable[..., ServerProcess], fuzz_root: Path) -> ServerProcess:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    return server_factory(
        "-m", str(model), "-c", "1024", "-np", "2", "-t", "1", "-tb", "1", "--metrics",
        "--page-ram-bytes", "2M", "--max-n-predict", "8",
        "--slot-save-path", str(fuzz_root / "slots"),
        fresh=True, env={"PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip


def assert_typed_error(resp: httpx.Response, body: bytes) -> None:
    payload = json.loads(body)
    err = payload["error"]
    assert err["code"] == resp.status_code, payload
    assert err["type"] in ERROR_TYPES and isinstance(err["message"], str), payload


def check_case(server: ServerProcess, case: Case) -> int:
    """Send one case and check the answer and the server; returns the HTTP status."""
    headers = {"Content-Type": "application/json"}
    with server.client.stream(case.method, case.url, content=case.content, headers=headers) as r:
        body = r.read()
    assert r.status_code < 500 or r.status_code in (501, 503), (r.status_code, body[:2000])
    if r.status_code >= 400:
        assert_typed_error(r, body)
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in body.decode("utf-8").splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    assert event["error"]["type"] in ERROR_TYPES, event
                    assert event["error"]["type"] != ErrorKind.SERVER.value, event
    assert server.proc.poll() is None, server.log()
    assert server.client.get("/health").status_code == 200, server.log()
    return r.status_code


def test_every_route_survives_generated_requests(
    fuzz_server: ServerProcess, fuzz_root: Path
) -> None:
    fuzz_server.client.timeout = httpx.Timeout(60)
    document = fuzz_server.client.get("/openapi.json").json()
    fuzzer = Fuzzer(document, HINTS, CAPS)
    operations = fuzzer.operations()
    assert {"/completion", "/v1/chat/completions", "/slots/{id_slot}", "/pages"} <= {
        op.path for op in operations
    }
    statuses: Counter[int] = Counter()
    chosen = [op for op in operations if ONLY.search(op.path)]
    for op in chosen:

        @settings(
            max_examples=N_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=fuzzer.cases(op))
        def run(case: Case) -> None:
            try:
                statuses[check_case(fuzz_server, case)] += 1
            except (AssertionError, httpx.TransportError) as err:
                print(f"FAILED CASE {case.method} {case.url} {case.content!r}\n{fuzz_server.log()}")
                raise AssertionError(f"{case.describe()}: {err!r}") from err

        run()

    print(
        f"\n{statuses.total()} cases over {len(chosen)} operations; statuses {sorted(statuses.items())}"
    )
    slots = fuzz_server.client.get("/slots").json()
    assert not any(s["is_processing"] for s in slots), slots
    assert sorted(p.name for p in fuzz_root.iterdir()) == ["outside.bin", "slots"]
    assert (fuzz_root / "outside.bin").read_bytes() == b"not a slot file"
    assert (fuzz_root / "slots" / "link.bin").is_symlink()


# Requests the fuzzer found to crash or fail the server, kept as fixed regression cases.
FOUND = [
    ("POST", "/reconfigure", b'{"n_ctx": 1}'),  # libllama aborted (GGML_ASSERT): n_ctx < n_parallel
    ("POST", "/reconfigure", b'{"n_batch": 1}'),  # the same through n_batch
]


@pytest.mark.parametrize(("method", "url", "content"), FOUND)
def test_found_defects_stay_fixed(
    fuzz_server: ServerProcess, method: str, url: str, content: bytes
) -> None:
    check_case(fuzz_server, Case(method, url, content))


def test_the_openapi_document_uses_standard_json_schema_bounds(fuzz_server: ServerProcess) -> None:
    """Bounds published as pydantic's `ge`/`le` (not `minimum`/`maximum`) are invisible to
    clients and to this fuzzer."""
    text = fuzz_server.client.get("/openapi.json").text
    assert '"ge":' not in text and '"le":' not in text
