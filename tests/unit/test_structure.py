"""The house's structure rules, checked on the source tree (ast only: nothing is imported).

1. No module under `engine/` imports the engine module, not even under TYPE_CHECKING, except the
   asyncio client above it: managers get the narrow owners they use.
2. Neither the HTTP layer, the minds layer nor the tiers import the engine module: they talk
   through the client.
3. Packages import only from lower layers (`core` at the bottom, the entry points at the top).
4. No import circles between modules.
5. No class reaches into another object's underscored members.
6. Small files: none over 500 lines; short functions: none over 60 lines (but an allow-list).
7. A mind's turn (`kvswap.minds`) imports nothing of the HTTP server: not `kvswap.server`, not
   FastAPI or Starlette.
8. Inside `server/`, no import runs back up: each unit (a shell module `server/x.py`, or a
   sub-folder `server/x/`) has a rank in `SERVER_RANKS` and imports only units of a lower rank
   (a unit's own modules import one another freely). The API families (`llama/`, `openai/`,
   `anthropic/`, `pages/`) share one rank, so none imports another, and only `server/app.py`
   imports an API family folder at all (no shell module, no other package).
9. The shared tier is reached through its facade: outside `tiers/shared/`, a module imports
   only `tiers.shared.replica` and `tiers.shared.errors` of it.

Each test names every violation it finds. `KVSWAP_STRUCTURE_ROOT` points them at another tree
(an older checkout, to see what they would have caught there).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(os.environ.get("KVSWAP_STRUCTURE_ROOT", Path(__file__).resolve().parents[2]))
SRC = ROOT / "src" / "kvswap"
ENGINE_MODULE = "kvswap.engine.engine"
MAX_LINES = 500

# A package may import from packages of a lower rank only (and from itself).
RANKS = {
    "core": 0,
    "grammar": 1,
    "files": 1,
    "text": 1,
    "models": 1,
    "web": 1,
    "chat": 2,
    "backend": 2,
    "config": 3,
    "tiny": 3,
    "engine": 4,
    "tiers": 5,
    "minds": 6,
    "server": 7,
    "cluster": 8,
    "agents": 9,
    "bench": 10,
    "serve": 10,
    "cli": 11,
    "__main__": 12,
}

# Inside `server/`: a unit imports only units of a lower rank. The shell's leaves first; then
# the request layer (a body made ready to run, which reads the server through a Protocol), the
# state every route reads, the runner; the API families; what builds and guards the app.
SERVER_RANKS = {
    "__init__": 0,
    "asgi": 0,  # ASGI aliases, the scope entries, the disconnect wait
    "resumable": 0,  # llama-server's resumable streams (X-Conversation-Id)
    "enginebuild": 0,  # the engine from the flags (the prefetch thread builds it): no HTTP
    "errors": 0,
    "formats": 0,
    "openapi": 0,
    "prefetch": 0,
    "prometheus": 0,
    "routes_web": 0,
    "sse": 0,
    "startup": 0,
    "cors": 1,
    "formats_cluster": 1,
    "formats_native": 1,
    "internal": 1,
    "requestlog": 1,
    "turnfacts": 1,
    "peerauth": 0,  # replica-to-replica signatures (hashlib, hmac)
    "requests": 2,
    "state": 3,
    "streaming": 4,
    "llama": 5,
    "openai": 5,
    "anthropic": 5,
    "pages": 5,
    "forward": 6,
    "gcp": 6,
    "loader": 6,
    "sleep": 7,
    "guard": 8,
    "app": 9,
}
API_FAMILIES = ("llama", "openai", "anthropic", "pages")
SHARED_TIER = "kvswap.tiers.shared"
SHARED_FACADE = ("kvswap.tiers.shared.replica", "kvswap.tiers.shared.errors")
APP_MODULE = "kvswap.server.app"

# A function may be this long at most (its `def` line to its last, nested functions included).
MAX_FUNCTION_LINES = 60
# Functions allowed to be longer (none today; the list may only shrink).
LONG_FUNCTIONS_ALLOWED: frozenset[str] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every kvswap module `name` imports (TYPE_CHECKING blocks included), with its line."""
    package = name if (SRC.parent / name.replace(".", "/") / "__init__.py").exists() else ""
    base = package or name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kvswap"):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{target}.{node.module}" if node.module else target
            else:
                module = node.module or ""
            if not module.startswith("kvswap"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                yield (sub if sub in MODULES else module), node.lineno


EDGES = {name: sorted(set(_imports(name, tree))) for name, tree in MODULES.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _server_unit(module: str) -> str | None:
    """The unit of a module inside `server/` (its shell module or sub-folder); None outside."""
    parts = module.split(".")
    if parts[:2] != ["kvswap", "server"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def _all_imports(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every absolute module name a module imports (any package), with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module, node.lineno


def test_no_engine_module_imports_the_engine() -> None:
    bad = [
        f"{name}:{line} imports {target}"
        for name, edges in EDGES.items()
        if name.startswith("kvswap.engine.") and name not in (ENGINE_MODULE, "kvswap.engine.client")
        for target, line in edges
        if target == ENGINE_MODULE
    ]
    assert not bad, "managers must get narrow owners, not the engine:\n" + "\n".join(bad)


def test_server_and_tiers_reach_the_engine_through_its_client() -> None:
    bad = [
        f"{name}:{line} imports {target}"
        for name, edges in EDGES.items()
        if _package(name) in ("server", "minds", "tiers", "web", "cluster")
        for target, line in edges
        if target == ENGINE_MODULE
    ]
    assert not bad, "the HTTP side never holds the Engine:\n" + "\n".join(bad)


def test_packages_import_only_downward() -> None:
    unknown = sorted({_package(n) for n in MODULES if _package(n) and _package(n) not in RANKS})
    assert not unknown, f"packages without a layer in RANKS: {unknown}"
    bad = []
    for name, edges in EDGES.items():
        src = _package(name)
        for target, line in edges:
            dst = _package(target)
            if src and dst and src != dst and RANKS[dst] >= RANKS[src]:
                bad.append(f"{name}:{line} ({src}) imports {target} ({dst})")
    assert not bad, "imports pointing up or sideways:\n" + "\n".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {n: [t for t, _ in EDGES[n] if t in MODULES and t != n] for n in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    cycles = _cycles()
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_reach_into_other_objects_private_members() -> None:
    bad = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                bad.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "underscored members used from outside their object:\n" + "\n".join(bad)


def test_files_stay_small() -> None:
    big = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not big, f"files over {MAX_LINES} lines:\n" + "\n".join(big)


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function under `tree` by its qualified name, with its length in lines."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def test_functions_stay_short() -> None:
    """A function of more than MAX_FUNCTION_LINES lines is named, unless allow-listed; an
    allow-list entry that is short by now (or gone) is named too, so the list only shrinks."""
    long = {}
    for p in sorted(SRC.rglob("*.py")):
        for name, n in _functions(ast.parse(p.read_text(), str(p))):
            if n > MAX_FUNCTION_LINES:
                long[f"{p.relative_to(SRC.parent)}: {name}"] = n
    bad = [
        f"{where} is {n} lines" for where, n in long.items() if where not in LONG_FUNCTIONS_ALLOWED
    ]
    stale = sorted(LONG_FUNCTIONS_ALLOWED - set(long))
    assert not bad and not stale, (
        f"functions over {MAX_FUNCTION_LINES} lines:\n"
        + "\n".join(bad)
        + ("\nallowed long, but short by now (drop them from the list):\n" if stale else "")
        + "\n".join(stale)
    )


def test_the_minds_layer_imports_no_http() -> None:
    """`kvswap.minds` runs a mind's turn without HTTP: the server maps requests onto it."""
    banned = ("kvswap.server", "fastapi", "starlette")
    bad = [
        f"{name}:{line} imports {target}"
        for name, tree in MODULES.items()
        if _package(name) == "minds"
        for target, line in _all_imports(tree)
        if any(target == b or target.startswith(b + ".") for b in banned)
    ]
    assert not bad, "the minds layer must not import HTTP:\n" + "\n".join(bad)


def test_server_imports_only_downward() -> None:
    units = {u for n in MODULES if (u := _server_unit(n)) is not None}
    unknown = sorted(units - set(SERVER_RANKS))
    assert not unknown, f"server units without a rank in SERVER_RANKS: {unknown}"
    bad = []
    for name, edges in EDGES.items():
        src = _server_unit(name)
        if src is None:
            continue
        for target, line in edges:
            dst = _server_unit(target)
            if dst is not None and dst != src and SERVER_RANKS[dst] >= SERVER_RANKS[src]:
                bad.append(f"{name}:{line} ({src}) imports {target} ({dst})")
    assert not bad, "server imports pointing up or sideways:\n" + "\n".join(bad)


def test_only_the_app_imports_an_api_family() -> None:
    bad = [
        f"{name}:{line} imports {target}"
        for name, edges in EDGES.items()
        if name != APP_MODULE
        for target, line in edges
        if (family := _server_unit(target)) in API_FAMILIES and _server_unit(name) != family
    ]
    assert not bad, f"only {APP_MODULE} imports an API family folder:\n" + "\n".join(bad)


def test_the_shared_tier_is_reached_through_its_facade() -> None:
    bad = [
        f"{name}:{line} imports {target}"
        for name, edges in EDGES.items()
        if not name.startswith(SHARED_TIER)
        for target, line in edges
        if target.startswith(SHARED_TIER + ".") and target not in SHARED_FACADE
    ]
    assert not bad, "the shared tier's inside, reached past its facade:\n" + "\n".join(bad)
