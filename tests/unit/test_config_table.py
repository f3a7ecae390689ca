"""The flag tables: well formed, every implemented flag applies, and in step with arg.cpp.

The last test reads the pinned llama.cpp's common/arg.cpp (from $KVSWAP_LLAMA_CPP_SRC, else the
llama-cpp-python 0.3.36 sdist that scripts/setup.sh unpacks under .cache/) and checks that
kvswap accepts exactly the server example's flags, with the same spellings, environment
variables and arity. Without that source it skips on a developer's machine and fails under CI.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kvswap.config import MachineInfo, parse_serve_args, table_cluster
from kvswap.config.argspec import Group, Kind
from kvswap.config.flags import all_flags

HOST = MachineInfo(physical_ram_bytes=16 << 30, n_cpu_physical=4, n_cpu_logical=8)

# A valid value for the implemented flags that do not take a plain number.
SAMPLES = {
    "-fa": "on",
    "--rope-scaling": "yarn",
    "--override-kv": "llama.context_length=int:32768",
    "-ctk": "q8_0",
    "-ctv": "q8_0",
    "--spec-draft-type-k": "q8_0",
    "--spec-draft-type-v": "q8_0",
    "-lm": "mmap",
    "--lora": "a.gguf",
    "--lora-scaled": "a.gguf:0.5",
    "--samplers": "top_k;temp",
    "--sampler-seq": "kt",
    "-l": "1+1",
    "-m": "m.gguf",
    "--spec-draft-model": "d.gguf",
    "--spec-type": "ngram-simple",
    "--host": "0.0.0.0",
    "-a": "name",
    "--tags": "t",
    "--api-key": "k",
    "--api-prefix": "/v",
    "--chat-template": "chatml",
    "--log-file": "x.log",
    "--dry-sequence-breaker": "x",
    "--ctx-checkpoints-bytes": "1M",
    "--page-ram-bytes": "1M",
    "--page-disk-bytes": "1M",
    "--max-body-bytes": "1M",
    "--ui-mcp-proxy-allow": "127.0.0.1,10.0.0.0/8",
    "-sps": "0.5",
    "--shared-tier": "redis://127.0.0.1:6379/0",
    "--replica-id": "r1",
    "--advertise-url": "http://127.0.0.1:8081",
    "--shared-tier-bytes": "1G",
    "--shared-tier-lease-ms": "2000",
    "--shared-tier-peers": "http://127.0.0.1:8081",
    "--shared-tier-quiet-seconds": "1",
    "--shared-tier-release-seconds": "30",
    "--shared-tier-drain-seconds": "20",
    "--chat-template-kwargs": '{"enable_thinking": false}',
}
# A cluster flag means something only in a cluster: the flags it is given with.
IN_CLUSTER = [
    "--shared-tier", "redis://127.0.0.1:6379/0", "--replica-id", "r1",
    "--advertise-url", "http://127.0.0.1:8081", "--shared-tier-peers", "http://127.0.0.1:8081",
]  # fmt: skip
NEEDS_PATH = {"--api-key-file", "--slot-save-path", "--chat-template-file", "--path"}
NEEDS_DIR = {"--slot-save-path", "--path"}
# --spec-default asks for ngram-mod, which kvswap refuses; a TLS file alone needs its pair.
FAILS_BY_DESIGN = {"--spec-default", "--ssl-key-file", "--ssl-cert-file"}
FAILS_BY_DESIGN |= {
    "--models-dir",
    "--models-preset",
    "--models-max",
    "--models-autoload",
}  # router


def test_no_spelling_or_env_var_is_claimed_twice() -> None:
    spellings = [name for f in all_flags() for name in (*f.names, *f.neg)]
    assert len(spellings) == len(set(spellings))
    envs = [f.env for f in all_flags() if f.env]
    assert len(envs) == len(set(envs))


def test_entries_are_consistent() -> None:
    for f in all_flags():
        assert all(name.startswith("-") for name in (*f.names, *f.neg)), f.names
        assert bool(f.neg) == (f.kind is Kind.TOGGLE), f.names
        assert (f.removed is not None) == (f.group is Group.REMOVED), f.names
        if f.group not in (Group.IGNORED, Group.REMOVED, Group.INFO):
            assert f.apply is not None and f.help, f.names
        else:
            assert f.apply is None, f.names
        if f.group.kvswap_only:
            assert f.env is not None and f.env.startswith("KVSWAP_ARG_"), f.names
        else:
            assert f.env is None or not f.env.startswith("KVSWAP_ARG_"), f.names


def _sample(primary: str, tmp_path: Path) -> str:
    if primary in NEEDS_PATH:
        if primary in NEEDS_DIR:
            return str(tmp_path)
        path = tmp_path / "file.txt"
        path.write_text("x\n")
        return str(path)
    return SAMPLES.get(primary, "1")


def test_every_spelling_of_every_implemented_flag_applies(tmp_path: Path) -> None:
    cluster = {f.primary for f in table_cluster.FLAGS}
    for f in all_flags():
        if f.apply is None or f.primary in FAILS_BY_DESIGN:
            continue
        context = IN_CLUSTER if f.primary in cluster else []
        for name in (*f.names, *f.neg):
            value = [_sample(f.primary, tmp_path)] if f.kind is Kind.VALUE else []
            cfg = parse_serve_args([*context, name, *value], {}, machine=HOST)
            assert cfg.ignored_flags == (), name
            if f.env:
                env_value = "1" if f.kind is not Kind.VALUE else value[0]
                parse_serve_args(context, {f.env: env_value}, machine=HOST)


def test_every_ignored_flag_is_consumed_and_listed() -> None:
    for f in all_flags():
        if f.group is not Group.IGNORED:
            continue
        n_values = {Kind.VOID: 0, Kind.TOGGLE: 0, Kind.VALUE: 1, Kind.PAIR: 2}[f.kind]
        for name in (*f.names, *f.neg):
            argv = [name, *(["v"] * n_values), "-c", "77"]
            cfg = parse_serve_args(argv, {}, machine=HOST)
            assert cfg.ignored_flags == (name,)
            assert cfg.context.n_ctx == 77


LLAMA_CPP_SRC = (
    Path(__file__).resolve().parents[2] / ".cache/llama-cpp-python-0.3.36/vendor/llama.cpp"
)


def _arg_cpp() -> Path:
    root = os.environ.get("KVSWAP_LLAMA_CPP_SRC") or LLAMA_CPP_SRC
    return Path(root) / "common" / "arg.cpp"


def _server_flags_in_arg_cpp(src: str) -> list[dict[str, object]]:
    """Each add_opt of common_params_parser_init that the server example keeps."""
    mmproj = re.search(r"mmproj_examples = \{([^}]*)\}", src)
    assert mmproj is not None
    body = src[src.index("common_params_parser_init(common_params") :]
    body = body[: body.index("void common_params_add_preset_options")]
    found: list[dict[str, object]] = []
    for chunk in body.split("add_opt(common_arg(")[1:]:
        text = re.sub(r"^\s*//[^\n]*\n", "", chunk).lstrip()
        lists = re.match(r"\{([^}]*)\}\s*,\s*(?:\{([^}]*)\}\s*,)?", text)
        assert lists is not None, text[:80]
        examples = re.search(r"\.set_examples\(\s*(\{[^}]*\}|mmproj_examples)\s*\)", chunk)
        in_examples = examples.group(1) if examples else "LLAMA_EXAMPLE_COMMON"
        in_examples = in_examples.replace("mmproj_examples", mmproj.group(1))
        excludes = re.search(r"\.set_excludes\(\s*\{([^}]*)\}\s*\)", chunk)
        if "LLAMA_EXAMPLE_SERVER" in (excludes.group(1) if excludes else ""):
            continue
        if not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", in_examples):
            continue
        handler = re.search(r"\[\]\(common_params\s*&[^,)]*((?:,[^)]*)?)\)", chunk)
        assert handler is not None
        n_values = handler.group(1).count("std::string") + handler.group(1).count("int")
        env = re.search(r'\.set_env\("([^"]+)"\)', chunk)
        found.append(
            {
                "names": tuple(re.findall(r'"([^"]+)"', lists.group(1))),
                "neg": tuple(re.findall(r'"([^"]+)"', lists.group(2) or "")),
                "env": env.group(1) if env else None,
                "n_values": 0 if "bool" in handler.group(1) else n_values,
            }
        )
    return found


def test_flags_match_the_pinned_arg_cpp() -> None:
    path = _arg_cpp()
    if not path.is_file():
        pytest.skip(f"llama.cpp source not found at {path} (scripts/setup.sh unpacks it)")
    upstream: dict[tuple[str, ...], dict[str, object]] = {}
    for entry in _server_flags_in_arg_cpp(path.read_text()):
        names = entry["names"]
        assert isinstance(names, tuple)
        upstream.setdefault(names, entry)  # -np is defined twice; the server's comes first
    ours = {f.names: f for f in all_flags() if not f.group.kvswap_only}
    assert sorted(ours) == sorted(upstream)
    n_values = {Kind.VOID: 0, Kind.TOGGLE: 0, Kind.VALUE: 1, Kind.PAIR: 2}
    for names, entry in upstream.items():
        f = ours[names]
        assert (f.neg, f.env, n_values[f.kind]) == (entry["neg"], entry["env"], entry["n_values"])
