"""Local tiny models standing in for the hub models of llama.cpp's server test suite.

Owns which generated model replaces each `--hf-repo`/`--hf-file` the pinned suite names and each
file it fetches with `download_file` (a draft model, a LoRA adapter). `prepare()` generates them
(into kvswap's tiny-model cache), writes the map the launcher reads, and puts the downloaded
files where the suite's `download_file` finds them already present (`<suite>/tmp/<name>`), so
nothing reaches a hub. Both servers get the same files, so a pass list measured on llama-server
holds for kvswap.

Run by `scripts/compat.sh`: `python -m tests.compat.standins SUITE_DIR MAP_JSON`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kvswap.tiny.cache import tiny_model_path
from kvswap.tiny.lora import tiny_lora_path

# The target: a tiny random llama with SmolLM2's vocabulary and chat template, whose output
# rows of control and non-printable tokens are zero, so it writes clean text (llama-server
# answers invalid UTF-8 in its JSON with a 500; the suite checks behaviour, not that).
TARGET = {"arch": "llama", "vocab": "smollm2", "clean_text": True}
# A smaller llama with the same vocabulary: a valid draft for TARGET.
DRAFT = {"arch": "llama", "vocab": "smollm2", "clean_text": True, "n_embd": 32}

# Hub models by (repo, file or ""): every model a ServerPreset of the suite loads, since the
# suite's session fixture starts each preset once. A repo missing here has no stand-in, and
# the launcher refuses it (e.g. the split stories15M, the 7B-8B models of the slow tests).
HUB_MODELS: dict[tuple[str, str], dict[str, object]] = {
    ("ggml-org/test-model-stories260K", ""): TARGET,
    ("ggml-org/test-model-stories260K-infill", ""): TARGET,
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): TARGET,
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): TARGET,
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): TARGET,
    ("ggml-org/tinygemma3-GGUF:Q8_0", ""): TARGET,
}

# Files the suite fetches with download_file(URL) into tmp/<last part of the URL>.
DRAFT_FILE = "stories15M-q4_0.gguf"  # test_speculative's draft model
LORA_FILE = "moe_shakespeare15M.gguf"  # test_lora's adapter for stories15M_MOE


def map_key(repo: str, hf_file: str) -> str:
    """The launcher's lookup key for `--hf-repo REPO [--hf-file FILE]`."""
    return f"{repo}|{hf_file}"


def _place(src: Path, dst: Path) -> None:
    """`dst` becomes a symlink to `src` (replacing an older one)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    os.symlink(src, dst)


def prepare(suite_dir: Path, map_path: Path) -> dict[str, str]:
    """Generate the stand-ins, place the downloads, write the launcher's map; returns the map."""
    target = tiny_model_path(**TARGET)  # type: ignore[arg-type]
    draft = tiny_model_path(**DRAFT)  # type: ignore[arg-type]
    lora = tiny_lora_path(target)
    models = {
        map_key(repo, hf_file): str(tiny_model_path(**params))  # type: ignore[arg-type]
        for (repo, hf_file), params in HUB_MODELS.items()
    }
    _place(draft, suite_dir / "tmp" / DRAFT_FILE)
    _place(lora, suite_dir / "tmp" / LORA_FILE)
    map_path.parent.mkdir(parents=True, exist_ok=True)
    map_path.write_text(json.dumps({"models": models, "target": str(target)}, indent=1))
    return models


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.compat.standins SUITE_DIR MAP_JSON", file=sys.stderr)
        return 2
    models = prepare(Path(argv[0]), Path(argv[1]))
    print(f"compat: {len(models)} hub models mapped to tiny local models ({argv[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
