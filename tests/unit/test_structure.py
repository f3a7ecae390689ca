"""The house's structure rules, checked on the source tree (ast only: nothing is imported).

1. No module under `engine/` imports the engine module, not even under TYPE_CHECKING, except the
   asyncio client above it: managers get the narrow owners they use.
2. Neither the HTTP layer nor the tiers import the engine module: they talk through the client.
3. Packages import only from lower layers (`core` at the bottom, the entry points at the top).
4. No import circles between modules.
5. No class reaches into another object's underscored members.
6. Small files: none over 500 lines.

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
    "server": 6,
    "cluster": 7,
    "bench": 8,
    "serve": 8,
    "cli": 9,
    "__main__": 10,
}


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
        if _package(name) in ("server", "tiers", "web", "cluster")
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
