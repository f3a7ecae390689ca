"""The repository stands alone: nothing a user's clone holds points at files it does not have.

A newcomer's clone has no `../shared` (the project's specification and research notes live
beside the repository, not in it): the README pointed at `../shared/SPEC.md`, docs/CLUSTER.md at
`CLUSTER-RESEARCH.md`, docs/FINDINGS.md at `../shared/notes`. What the docs rely on is in
`docs/` (docs/DESIGN.md, docs/CLUSTER.md's "Why it is built this way"). Every tracked file
outside `tests/` is read, source docstrings included.

`PENDING` holds the citations left in modules that other work is moving today: each is the
stripped text of its line, so it stays found when its file moves. It only shrinks: a citation
not in it fails, and so does an entry no file holds any more (remove it once its line is fixed).
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ../shared, the notes folder, the two documents by name, and SPEC cited as a document (not the
# `SPEC` help group of the flag tables: `Group.SPEC`, `SPEC = ...`, `VALUE, SPEC, ...`).
CITATION = re.compile(
    r"\.\./shared|/work/shared|shared/notes|SPEC\.md|CLUSTER-RESEARCH|(?<![.\w])SPEC(?!\s*=|,|\w)"
)

PENDING = Counter(
    [
        '"""The HAProxy 2.6 configuration of a kvswap cluster, and its runtime API '
        "(CLUSTER-RESEARCH.md §3).",
        '"""The result of `PageOut` and `PageIn` (SPEC §3 result fields)."""',
        '"""Context checkpoints: where to take them, and the byte budget they live under '
        "(SPEC §6).",
        "Rules (SPEC §3):",
        '"""Rewriting the stream header of a plain KV cache\'s sequence state (SPEC §7).',
        '"""The pure part of a reconfigure (SPEC §7): the target geometry, the memory check, '
        "and which",
        '"""POST /reconfigure on the engine thread: a relaunch is a pause, not a reload (SPEC §7).',
        '"""kvswap.files: slot files on disk and their crash-safe publication (SPEC §4). '
        "No libllama.",
        "Page names (SPEC §3) never become paths: 1-255 bytes of UTF-8, no path separators, "
        "no `..`, no",
        '"""`Publisher`: crash-safe publication and reading of slot-file generations (SPEC §4).',
        "additions to /props (`slot_page_version`, `context_geometry`) are SPEC §8.",
        '"""`get_res_props`, plus `slot_page_version` and `context_geometry` (SPEC §8).',
        '"""Response bodies of the page verbs and GET /pages (kvswap\'s own, SPEC §3).',
        '"""POST /reconfigure: change n_ctx, n_parallel, batch sizes and KV types live (SPEC §7).',
        "read-only and safe on any thread (SPEC §1), and grammar checks were already made off "
        "the engine",
        "Rules (SPEC §0):",
        "# -- length and stopping (SPEC: a negative n_predict other than -1 is a 400)",
        "# llama-server skips malformed entries silently; SPEC makes a wrong type a 400.",
        '"""The shared tier: minds\' pages, token logs and owner leases in Redis '
        "(CLUSTER-RESEARCH.md §4).",
        "lease keys (CLUSTER-RESEARCH.md §4.2). Instead every mind's stored bytes are charged here",
        "everyone else, CLUSTER-RESEARCH.md §4.2). `ChunkIO` sends them as pipelines of "
        "`depth` chunks,",
        '"""Per-mind owner leases with fencing tokens, kept in Redis (CLUSTER-RESEARCH.md §4.3).',
        '"""The one writer and reader of slot files and page files (SPEC §4), on worker threads.',
        "/work/shared/notes/TINY-GGUF-ARCH-SPECS.md; the tests load every one of them with "
        "libllama.",
    ]
)


def _tracked_text_files() -> dict[str, str]:
    """Every tracked file outside tests/ that is text, by its path in the repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    out = {}
    for path in filter(None, listed.split("\0")):
        if path.startswith("tests/") or not (ROOT / path).is_file():
            continue
        try:
            out[path] = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file (a picture) cites nothing
    return out


def test_no_tracked_file_points_outside_the_repository() -> None:
    files = _tracked_text_files()
    assert "README.md" in files and "src/kvswap/config/flags.py" in files  # the listing worked
    found: Counter[str] = Counter()
    where: dict[str, str] = {}
    for path, text in files.items():
        for n, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line):
                found[line.strip()] += 1
                where.setdefault(line.strip(), f"{path}:{n}")
    new = [f"{where[line]}: {line}" for line in found if found[line] > PENDING[line]]
    assert not new, "points outside the repository (describe it in docs/ instead):\n" + "\n".join(
        new
    )
    fixed = [line for line in PENDING if found[line] < PENDING[line]]
    assert not fixed, "fixed: remove these from PENDING:\n" + "\n".join(fixed)


# A path the docs name: docs/NAME.md or .png, and relative Markdown links.
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.(?:md|png)\b")
LINK = re.compile(r"\]\(([^)#\s]+)")


def test_every_document_the_docs_name_is_in_the_repository() -> None:
    files = _tracked_text_files()
    markdown = {path: text for path, text in files.items() if path.endswith(".md")}
    assert "docs/DESIGN.md" in markdown  # what the README's "What it is" points at
    missing = []
    for path, text in markdown.items():
        for name in DOC_PATH.findall(text):
            if not (ROOT / name).is_file():
                missing.append(f"{path}: {name}")
        for target in LINK.findall(text):
            if "://" not in target and not (ROOT / path).parent.joinpath(target).exists():
                missing.append(f"{path}: ({target})")
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)
