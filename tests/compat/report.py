"""Compares a compat run of llama.cpp's server test suite with the pinned llama-server's passes.

Owns the two committed lists beside this file and their reading:
- `llama-server-passes.txt`: the test ids the pinned llama-server passes on the stand-in models
  (`standins.py`), with the command that measured them in its header;
- `differences.txt`: the few of those tests where kvswap deliberately answers otherwise
  (`TEST_ID | reason`), each explained in docs/COMPAT.md;
- `kvswap-passes.txt`: tests the pinned llama-server fails on the stand-in models for a reason
  of the stand-ins (`TEST_ID | reason`) that kvswap passes and must keep passing.

`ids` lists the pass list's tests of some files and kvswap's own (what scripts/compat.sh runs
by default). `check` prints, per file, llama-server's passes, kvswap's, and every test of the
lists kvswap does not pass; it fails (exit 1) on any such test not listed as a difference. `measure`
writes the pass list from a run against llama-server. `table` prints docs/COMPAT.md's table.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSES = HERE / "llama-server-passes.txt"
DIFFERENCES = HERE / "differences.txt"
KVSWAP_PASSES = HERE / "kvswap-passes.txt"


def read_results(path: Path) -> dict[str, str]:
    """Test id -> outcome from results_plugin's JSON lines."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["id"]] = row["outcome"]
    return out


def read_ids(path: Path) -> list[str]:
    """Non-comment lines of a list file (the part before ' | ' for differences)."""
    ids = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            ids.append(line.split(" | ", 1)[0].strip())
    return ids


def _file_of(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def required(files: list[str] | set[str]) -> list[str]:
    """The tests of `files` kvswap must pass: llama-server's passes, then kvswap's own."""
    return [t for t in read_ids(PASSES) + read_ids(KVSWAP_PASSES) if _file_of(t) in files]


def check(results: dict[str, str], files: list[str]) -> int:
    expected = required(files)
    differences = set(read_ids(DIFFERENCES))
    by_file: dict[str, list[str]] = defaultdict(list)
    for test_id in expected:
        by_file[_file_of(test_id)].append(test_id)
    n_failed = 0
    for name in files:
        ours = [t for t, outcome in results.items() if _file_of(t) == name and outcome == "passed"]
        theirs = by_file.get(name, [])
        missing = [t for t in theirs if results.get(t) != "passed"]
        print(
            f"compat: {name}: {len(theirs)} required (llama-server's passes, kvswap's own), "
            f"kvswap passes {len(ours)} ({len(theirs) - len(missing)} of them)"
        )
        for test_id in missing:
            outcome = results.get(test_id, "not run")
            if test_id in differences:
                print(f"compat:   difference (docs/COMPAT.md): {test_id} ({outcome})")
            else:
                print(f"compat:   FAILED: {test_id} ({outcome})")
                n_failed += 1
    # A listed difference kvswap passes now (another branch fixed it) is reported, not failed.
    for test_id in sorted(t for t in differences if results.get(t) == "passed"):
        print(f"compat: listed as a difference but kvswap passes it now: {test_id}")
    print(f"compat: {n_failed} required test(s) kvswap fails")
    return 1 if n_failed else 0


def measure(results: dict[str, str], command: str) -> int:
    passed = sorted(t for t, outcome in results.items() if outcome == "passed")
    header = [
        "# Test ids the pinned llama-server (llama.cpp of the llama-cpp-python 0.3.36 sdist)",
        "# passes on the stand-in models of tests/compat/standins.py. Measured with:",
        f"#   {command}",
    ]
    PASSES.write_text("\n".join([*header, *passed]) + "\n", encoding="utf-8")
    print(f"compat: wrote {len(passed)} passing test ids to {PASSES}")
    return 0


def _reasons() -> dict[str, str]:
    out = {}
    for line in DIFFERENCES.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#") and " | " in line:
            test_id, reason = line.split(" | ", 1)
            out[test_id.strip()] = reason.strip()
    return out


def table(results: dict[str, str], files: list[str]) -> int:
    """docs/COMPAT.md's tables: per file, every test either server passes, side by side."""
    theirs = set(read_ids(PASSES))
    reasons = _reasons()
    mark = {True: "pass", False: "-"}
    for name in files:
        ran = [t for t in results if _file_of(t) == name]
        ours = {t for t in ran if results[t] == "passed"}
        listed = sorted({t for t in theirs if _file_of(t) == name} | ours)
        mine = {t for t in theirs if _file_of(t) == name}
        print(f"### {name}\n")
        print(
            f"llama-server passes {len(mine)}; kvswap passes {len(ours & mine)} of them"
            f" and {len(ours - mine)} more of the {len(ran)} tests it ran;"
            f" {len({t for t in mine if t in reasons})} listed differences.\n"
        )
        if not listed:
            print("Neither server passes a test of this file on the stand-in models.\n")
            continue
        print("| test | llama-server | kvswap | difference |")
        print("|---|---|---|---|")
        for test_id in listed:
            short = test_id.split("::", 1)[1].replace("|", "\\|")
            note = reasons.get(test_id, "")
            print(f"| `{short}` | {mark[test_id in theirs]} | {mark[test_id in ours]} | {note} |")
        print()
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "ids":  # the pass list's tests of these files, one per line
        print("\n".join(required(set(argv[1:]))))
        return 0
    if len(argv) < 3 or argv[0] not in ("check", "measure", "table"):
        print(
            "usage: report.py ids FILE... | check|table RESULTS FILE... | measure RESULTS COMMAND"
        )
        return 2
    results = read_results(Path(argv[1]))
    if argv[0] == "measure":
        return measure(results, argv[2])
    return (check if argv[0] == "check" else table)(results, argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
