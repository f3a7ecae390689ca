"""Property-based fuzzing of every route in the server's own OpenAPI description, as a tenant of
a server with API keys, aimed at another tenant's state.

The server runs with three keys. Tenant 2 holds a mind (`SECRET`), spilled to disk by a first
server before the fuzzed one starts, so it lives only on disk while the fuzzer runs. The fuzzer
sends requests as tenant 1 (and, in some cases, with no key or a wrong one), with hints that aim
at names it must not reach: tenant 2's mind name, the files of tenant 2's spilled mind (found by
listing what its spill wrote, whatever the naming), internal names (`mind~...`, `anon~...`) for
pages and slot files, and escaping filenames.

For each operation the live server publishes, hypothesis draws requests (see `openapi_cases`)
and checks what a client relies on: never a 500, every error in the typed shape with the HTTP
status equal to its `code`, every SSE event valid JSON, the server alive (GET /health) after
each case, and no slot verb succeeds on tenant 2's files. At the end: no slot is left busy;
tenant 2's mind answers from exactly its own tokens (read back from disk, so nothing overwrote
it); a third key that made nothing sees no mind and no page in /pages; and nothing changed
outside the save path: not beside it, not in the server's working folder, not at the absolute
paths the hints name.

An operation whose first cases all answer 501 (the typed not-supported routes) gets no more.
`KVSWAP_FUZZ_EXAMPLES` (default 16) sets the cases per operation; a deeper run is
`KVSWAP_FUZZ_EXAMPLES=300 pytest tests/reliability/test_fuzz_routes.py`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from kvswap.core.errors import ErrorKind
from kvswap.core.keys import mind_key, namespace_of
from kvswap.minds.stored.records import OPENAI_CODES
from kvswap.server.anthropic.errors import ERROR_TYPES as ANTHROPIC_ERROR_TYPES
from kvswap.server.anthropic.errors import ROUTES as ANTHROPIC_ROUTES
from kvswap.tiers.mindfiles import MINDS_DIR, file_name
from kvswap.tiny import tiny_model_path
from tests.files.util import tree
from tests.reliability.openapi_cases import Case, Fuzzer
from tests.server.harness import ServerProcess

N_EXAMPLES = int(os.environ.get("KVSWAP_FUZZ_EXAMPLES", "16"))
N_PROBE = 3  # cases that decide whether an operation answers only 501
ONLY = re.compile(os.environ.get("KVSWAP_FUZZ_ONLY", ""))
ERROR_TYPES = {kind.value for kind in ErrorKind}
ANTHROPIC_TYPES = {*ANTHROPIC_ERROR_TYPES.values(), "api_error"}
pytestmark = [pytest.mark.model, pytest.mark.timeout(120 + 12 * N_EXAMPLES)]

K1, K2, K3 = "fuzz-key-one", "fuzz-key-two", "fuzz-key-three"
SECRET = "secret"  # tenant 2's mind
AS_K1 = (("Authorization", f"Bearer {K1}"),)

# Keep live reconfigures to pools this shared machine can build in milliseconds; out-of-range
# values (a 1e9-token pool) are refused by a memory check the unit tests cover.
CAPS = {"n_ctx": (1, 4096), "n_batch": (1, 4096), "n_ubatch": (1, 4096), "n_parallel": (1, 8)}


def _hints(root: Path, protected: tuple[str, ...]) -> dict[str, tuple[object, ...]]:
    internal = ("mind~", "mind~public~736563726574", "anon~0", "anon~1", "anon~")
    escaping = ("../up.bin", "..", "a/b", str(root / "abs" / "abs.bin"), "/etc/passwd", "a\x00b")
    return {
        "action": ("save", "restore", "erase", "page_out", "page_in", "spill", "page_drop", "drop"),
        "name": (SECRET, "mine", "anon~0"),  # POST /minds/{name}: tenant 2's mind's name
        "page": ("p0", "p1", SECRET, "x" * 300, "nul\x00", *internal, *protected),
        "filename": ("f0.bin", "f1.bin", "link.bin", ".lock", *escaping, *internal, *protected),
        "mind": (SECRET, "mine", "", "x" * 300, *internal),
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


HEADERS: dict[str, tuple[str | None, ...]] = {
    # Mostly tenant 1; sometimes no key or a wrong one (a typed 401).
    "Authorization": (*[f"Bearer {K1}"] * 6, None, "Bearer not-a-key"),
    "X-Mind-Id": (None, None, SECRET, "mine", "anon~0"),
}


@dataclass(frozen=True)
class Tenants:
    server: ServerProcess
    root: Path
    secret_prompt: list[int]
    secret_tokens: list[int]  # what tenant 2's mind holds (its KV)
    protected: tuple[str, ...]  # names aimed at the files tenant 2's mind was spilled to
    into: tuple[str, ...]  # of those, the ones that name its folder or a path into it


def _args(root: Path) -> tuple[str, ...]:
    model = tiny_model_path("llama", seed=7, vocab="tiny")
    return ("-m", str(model), "-c", "1024", "-np", "2", "-t", "1", "-tb", "1", "--metrics",
            "--page-ram-bytes", "2M", "--max-n-predict", "8", "--api-key", f"{K1},{K2},{K3}",
            "--slot-save-path", str(root / "slots"))  # fmt: skip


@pytest.fixture(scope="module")
def tenants(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> Tenants:
    root = tmp_path_factory.mktemp("fuzz")
    for folder in ("slots", "cwd", "abs"):
        (root / folder).mkdir()
    (root / "outside.bin").write_bytes(b"not a slot file")
    # A symlink placed in the save path that points out of it.
    (root / "slots" / "link.bin").symlink_to(root / "outside.bin")
    first = server_factory(*_args(root), fresh=True)
    prompt = [3 + (7 * i) % 200 for i in range(40)]
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "mind": SECRET}
    resp = first.post("/completion", body, headers={"Authorization": f"Bearer {K2}"})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert first.stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # spills tenant 2's mind
    secret = _secret_files(root)
    assert secret, "the mind was not spilled at exit"
    # Names aimed at its files: the folder and paths into it (a request naming them must fail),
    # and the files' own names (as slot file names they name other files: harmless, so long as
    # the mind's files never change, which every case checks).
    into = (MINDS_DIR, *(f"{MINDS_DIR}/{name}" for name in secret))
    server = server_factory(
        *_args(root), fresh=True, env={"PYTHONFAULTHANDLER": "1"}, cwd=root / "cwd"
    )
    tokens = prompt + out["tokens"][:-1]
    return Tenants(server, root, prompt, tokens, (*into, *secret), into)


def _secret_files(root: Path) -> dict[str, tuple[str, bytes]]:
    """Tenant 2's mind's files in the minds' folder, with their content digests."""
    stem = file_name(mind_key(namespace_of(K2), SECRET))
    return {k: v for k, v in tree(root / "slots" / MINDS_DIR).items() if k.startswith(stem)}


def assert_typed_error(resp: httpx.Response, body: bytes) -> None:
    payload = json.loads(body)
    err = payload["error"]
    if resp.request.url.path in ANTHROPIC_ROUTES:  # Anthropic's shape: its clients read it
        assert payload["type"] == "error", payload
        assert err["type"] in ANTHROPIC_TYPES and isinstance(err["message"], str), payload
        return
    # The status, or OpenAI's own code for that status where OpenAI names one.
    assert err["code"] == resp.status_code or OPENAI_CODES.get(err["code"]) == resp.status_code
    assert err["type"] in ERROR_TYPES and isinstance(err["message"], str), payload


def _filenames_in(case: Case) -> set[str]:
    """The file names a case uses (body `filename` of save, restore and spill). Page names
    (query `page`) name RAM pages of the caller's own namespace, never a file."""
    action = parse_qs(urlsplit(case.url).query).get("action", [""])[0]
    if action not in ("save", "restore", "spill"):
        return set()
    try:
        body = json.loads(case.content or b"")
    except ValueError:
        return set()
    if isinstance(body, dict) and isinstance(body.get("filename"), str):
        return {body["filename"]}
    return set()


def check_case(t: Tenants, case: Case) -> int:
    """Send one case and check the answer and the server; returns the HTTP status."""
    server = t.server
    secret = _secret_files(t.root)  # no case of tenant 1 may change them
    headers = {"Content-Type": "application/json", **dict(case.headers)}
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
    if r.status_code < 300 and case.url.startswith("/slots/"):
        reached = _filenames_in(case) & set(t.into)
        assert not reached, f"tenant 1 reached tenant 2's mind files {reached}: {body[:300]!r}"
    assert _secret_files(t.root) == secret, f"tenant 2's mind files changed: {body[:300]!r}"
    assert server.proc.poll() is None, server.log()
    assert server.client.get("/health").status_code == 200, server.log()
    return r.status_code


def _run(op_cases: object, n: int, body: Callable[[Case], None]) -> None:
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=op_cases)
    def run(case: Case) -> None:
        body(case)

    run()


def test_every_route_survives_generated_requests_of_another_tenant(tenants: Tenants) -> None:
    t = tenants
    server = t.server
    server.client.timeout = httpx.Timeout(60)
    outside = {k: v for k, v in tree(t.root).items() if not k.startswith("slots")}
    document = server.client.get("/openapi.json", headers=dict(AS_K1)).json()
    fuzzer = Fuzzer(document, _hints(t.root, t.protected), CAPS, HEADERS)
    operations = fuzzer.operations()
    assert {"/completion", "/v1/chat/completions", "/slots/{id_slot}", "/pages"} <= {
        op.path for op in operations
    }
    statuses: Counter[int] = Counter()
    only_501: list[str] = []
    chosen = [op for op in operations if ONLY.search(op.path)]
    for op in chosen:
        seen: Counter[int] = Counter()

        def one(case: Case, seen: Counter[int] = seen) -> None:
            try:
                seen[check_case(t, case)] += 1
            except (AssertionError, httpx.TransportError) as err:
                print(f"FAILED CASE {case.describe()}\n{server.log()}")
                raise AssertionError(f"{case.describe()}: {err!r}") from err

        _run(fuzzer.cases(op), N_PROBE, one)
        if 501 in seen and set(seen) <= {401, 501}:
            only_501.append(f"{op.method} {op.path}")
        else:
            _run(fuzzer.cases(op), N_EXAMPLES, one)
        statuses.update(seen)

    print(
        f"\n{statuses.total()} cases over {len(chosen)} operations ({len(only_501)} answer only "
        f"501: {N_PROBE} cases each); statuses {sorted(statuses.items())}"
    )
    slots = server.client.get("/slots", headers=dict(AS_K1)).json()
    assert not any(s["is_processing"] for s in slots), slots
    # Tenant 2's mind: read back from disk holding exactly its own tokens.
    probe = {"prompt": [*t.secret_tokens, 9, 9], "n_predict": 1, "mind": SECRET}
    back = server.post("/completion", probe, headers={"Authorization": f"Bearer {K2}"})
    assert back.status_code == 200, back.text
    assert back.json()["timings"]["cache_n"] == len(t.secret_tokens), back.json()["timings"]
    # Its turn changed it: the cases after this one start once that change is on disk.
    deadline = time.monotonic() + 60
    while True:
        minds = server.client.get("/pages", headers={"Authorization": f"Bearer {K2}"}).json()
        if all(m["n_tokens_on_disk"] == m["n_tokens"] for m in minds["minds"]):
            break
        assert time.monotonic() < deadline, minds
        time.sleep(0.1)
    # A tenant that made nothing sees nothing.
    pages = server.client.get("/pages", headers={"Authorization": f"Bearer {K3}"}).json()
    assert pages.get("minds", []) == [] and pages["pages"] == [], pages
    # Nothing outside the save path changed: beside it, in the server's folder, at abs/.
    assert {k: v for k, v in tree(t.root).items() if not k.startswith("slots")} == outside
    assert (t.root / "slots" / "link.bin").is_symlink()


# Requests the fuzzer found to crash or fail the server, kept as fixed regression cases.
FOUND = [
    ("POST", "/reconfigure", b'{"n_ctx": 1}'),  # libllama aborted (GGML_ASSERT): n_ctx < n_parallel
    ("POST", "/reconfigure", b'{"n_batch": 1}'),  # the same through n_batch
]


@pytest.mark.parametrize(("method", "url", "content"), FOUND)
def test_found_defects_stay_fixed(tenants: Tenants, method: str, url: str, content: bytes) -> None:
    check_case(tenants, Case(method, url, content, AS_K1))


@pytest.mark.parametrize("verb", ["save", "restore", "spill", "page_in", "page_out", "page_drop"])
def test_slot_verbs_never_reach_another_tenants_mind_files(tenants: Tenants, verb: str) -> None:
    """The fuzzer's aim, as fixed cases: each verb naming a file of tenant 2's spilled mind
    (as `filename` and as `page`) is refused."""
    for name in tenants.protected:
        # Slot 0 holds tenant 1's own state, so that a verb that may succeed does.
        fill = {"prompt": [5, 6, 7, 8], "n_predict": 1, "id_slot": 0}
        assert tenants.server.post("/completion", fill, headers=dict(AS_K1)).status_code == 200
        body = json.dumps({"filename": name, "drop": False}).encode()
        check_case(tenants, Case("POST", f"/slots/0?action={verb}&page={name}", body, AS_K1))


def test_the_openapi_document_publishes_every_body_field_with_standard_bounds(
    tenants: Tenants,
) -> None:
    """Bounds published as pydantic's `ge`/`le` (not `minimum`/`maximum`) are invisible to
    clients and to this fuzzer, and so is a body field left out (spill's `drop`)."""
    resp = tenants.server.client.get("/openapi.json", headers=dict(AS_K1))
    assert '"ge":' not in resp.text and '"le":' not in resp.text
    slot_verbs = resp.json()["paths"]["/slots/{id_slot}"]["post"]["requestBody"]
    assert {"filename", "drop"} <= set(re.findall(r'"(\w+)": \{', json.dumps(slot_verbs)))
