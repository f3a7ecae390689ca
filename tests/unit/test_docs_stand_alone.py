"""The repository stands alone: nothing a user's clone holds points at files it does not have.

A newcomer's clone has no `../shared` (the project's specification and research notes live
beside the repository, not in it): the README pointed at `../shared/SPEC.md`, docs/CLUSTER.md at
`CLUSTER-RESEARCH.md`, docs/FINDINGS.md at `../shared/notes`. What the docs rely on is in
`docs/` (docs/DESIGN.md, docs/CLUSTER.md's "Why it is built this way"). Every tracked file
outside `tests/` is read, source docstrings included.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ../shared, the notes folder, the two documents by name, and SPEC cited as a document (not the
# `SPEC` help group of the flag tables: `Group.SPEC`, `SPEC = ...`, `VALUE, SPEC, ...`).
CITATION = re.compile(
    r"\.\./shared|/work/shared|shared/notes|SPEC\.md|CLUSTER-RESEARCH|(?<![.\w])SPEC(?!\s*=|,|\w)"
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
    found = [
        f"{path}:{n}: {line.strip()}"
        for path, text in files.items()
        for n, line in enumerate(text.splitlines(), 1)
        if CITATION.search(line)
    ]
    assert not found, "points outside the repository (describe it in docs/ instead):\n" + "\n".join(
        found
    )


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
