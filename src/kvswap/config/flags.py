"""`kvswap serve`'s command line, read exactly as the pinned llama-server reads its own.

Owns `parse_serve_args` (argv + environment -> frozen `ServerConfig`) and `format_help`. The
flags live in data tables (`table_*.py`), one entry per flag; this module runs them:

1. Environment variables first, in table order, as llama-server: `LLAMA_ARG_X` (and
   `LLAMA_ARG_NO_X` for a toggle, which means false), then the command line in order, so the
   command line beats the environment, which beats the default. Flags that accumulate
   (`--api-key`, `--lora`, `-a`, `--spec-type`) collect from both, as llama-server.
2. A `--long_name` is read as `--long-name`; `--flag=value` is not a form llama-server knows.
3. Unknown words fail as llama-server (`error: invalid argument: X`); removed flags fail naming
   their replacement; flags kvswap does not implement are consumed and listed in
   `ServerConfig.ignored_flags`; `-h/--help/--usage`, `--version` and llama-server's other
   print-and-exit flags raise `HelpRequested` for the caller.
4. Derived values are settled once, as llama-server settles them before loading the model:
   thread counts, the KV pool sized by `--kv-unified-per-slot`, the speculative type.

Reads the files named by `--api-key-file`, checks `--slot-save-path`, `--path` and
`--chat-template-file`, and probes the host for defaults (`machine.MachineInfo`) unless given
one. It does not read llama.cpp's `config.ini` files.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence

from kvswap.config import (
    table_cluster,
    table_cors,
    table_ignored,
    table_model,
    table_rope,
    table_router,
    table_sampling,
    table_serving,
    table_spec,
    table_state,
)
from kvswap.config.argspec import Builder, Flag, Group, Kind, flag
from kvswap.config.errors import ConfigError, HelpRequested
from kvswap.config.machine import MachineInfo
from kvswap.config.settings import (
    ContextSettings,
    HttpSettings,
    LogSettings,
    ModelSettings,
    PagingSettings,
    SamplingDefaults,
    ServerConfig,
    SpecSettings,
)
from kvswap.config.table_spec import SUPPORTED_SPEC_TYPES
from kvswap.config.values import is_truthy, process_escapes, read_bool

# fmt: off
_INFO_FLAGS: tuple[Flag, ...] = (
    flag("-h --help --usage", Kind.VOID, Group.INFO, help="print usage and exit"),
    flag("--version", Kind.VOID, Group.INFO, help="show version and build info"),
    flag("-cl --cache-list", Kind.VOID, Group.INFO,
         help="llama-server: list cached models (kvswap has no model cache)"),
    flag("--completion-bash", Kind.VOID, Group.INFO,
         help="llama-server: print a bash completion script (not in kvswap)"),
    flag("--list-devices", Kind.VOID, Group.INFO,
         help="llama-server: list offload devices (not in kvswap)"),
)
# fmt: on


def all_flags() -> tuple[Flag, ...]:
    """Every flag `kvswap serve` accepts (implemented, removed, ignored), in env-scan order."""
    return (
        *_INFO_FLAGS,
        *table_model.FLAGS,
        table_model.PARALLEL,
        *table_rope.FLAGS,
        *table_sampling.FLAGS,
        *table_serving.FLAGS,
        *table_cluster.FLAGS,
        *table_state.FLAGS,
        *table_cors.FLAGS,
        *table_router.FLAGS,
        *table_spec.FLAGS,
        *table_spec.REMOVED,
        *table_ignored.FLAGS,
    )


def parse_serve_args(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    machine: MachineInfo | None = None,
) -> ServerConfig:
    """Read `kvswap serve`'s flags (argv without the program and subcommand) and environment.

    Raises `ConfigError` naming the flag or variable at fault, or `HelpRequested`. `machine`
    replaces the probed host (RAM, CPU counts) that some defaults are computed from.
    """
    host = machine if machine is not None else MachineInfo.probe()
    flags = all_flags()
    b = _new_builder(host)
    ignored: list[str] = []
    for entry in flags:
        from_env = _env_value(entry, environ)
        if from_env is not None:
            value, env = from_env
            _apply(b, entry, value, f'environment variable "{env}"', env, ignored)
    _read_argv(b, argv, _index(flags), ignored)
    return _finish(b, host, ignored)


def format_help() -> str:
    """The `--help` text: every flag by section (kvswap's own first, in `Group`'s order), with
    its default and environment variable."""
    lines = [
        "usage: kvswap serve [options]",
        "",
        'kvswap keeps many long conversations ("minds") warm in a few slots: a mind moves',
        "between its slot, a RAM page and disk at memcpy cost. A server for minds:",
        "",
        "  kvswap serve -c 8192 -np 4 -kvu --slot-save-path ./slots",
        "",
        "kvswap's own flags come first (their variables are KVSWAP_ARG_*), then the flags of the",
        "pinned llama-server, with its aliases, defaults and LLAMA_ARG_* variables. A later flag",
        "beats an earlier one, and flags beat environment variables. Sizes take k/M/G/T (powers",
        "of 1024) or plain numbers such as 20e9.",
    ]
    by_group: dict[Group, list[Flag]] = {group: [] for group in Group}
    for entry in all_flags():
        by_group[entry.group].append(entry)
    for group in Group:
        lines += ["", f"----- {group.value} -----", ""]
        lines += [_help_entry(entry) for entry in by_group[group]]
    return "\n".join(lines) + "\n"


def _help_entry(entry: Flag) -> str:
    head = ", ".join(entry.names + entry.neg)
    if entry.kind is Kind.VALUE:
        head += f" {entry.hint or 'VALUE'}"
    elif entry.kind is Kind.PAIR:
        head += " VALUE VALUE"
    text = entry.help
    if entry.env:
        text = f"{text} (env: {entry.env})".strip()
    body = textwrap.wrap(text, 60, break_on_hyphens=False) or [""]
    pad = " " * 40
    if len(head) > 37:
        return "\n".join([head] + [pad + line for line in body])
    return "\n".join([head.ljust(40) + body[0]] + [pad + line for line in body[1:]])


def _index(flags: Sequence[Flag]) -> dict[str, tuple[Flag, bool]]:
    """Spelling -> (entry, True for a positive name / False for a negative one)."""
    index: dict[str, tuple[Flag, bool]] = {}
    for entry in flags:
        for name in entry.names:
            index[name] = (entry, True)
        for name in entry.neg:
            index[name] = (entry, False)
    return index


def _new_builder(host: MachineInfo) -> Builder:
    return Builder(
        model=ModelSettings(),
        context=ContextSettings(n_threads=0, n_threads_batch=0),  # settled in _finish
        sampling=SamplingDefaults(),
        http=HttpSettings(),
        paging=PagingSettings(page_ram_bytes=host.default_page_ram_bytes()),
        spec=SpecSettings(n_threads_draft=0, n_threads_batch_draft=0),  # settled in _finish
        log=LogSettings(),
    )


def _env_value(entry: Flag, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(value as on the command line, the variable's name) from an entry's env var, or None."""
    if entry.env is None:
        return None
    negative_env = entry.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
    if entry.neg and entry.env.startswith("LLAMA_ARG_") and negative_env in environ:
        return "0", negative_env  # llama-server: any LLAMA_ARG_NO_X means false
    raw = environ.get(entry.env)
    if raw is None:
        return None
    if entry.kind is Kind.TOGGLE:
        try:
            return ("1" if read_bool(raw) else "0"), entry.env
        except ValueError as e:
            source = f'environment variable "{entry.env}"'
            raise ConfigError(f"error while handling {source}: {e}") from e
    if entry.kind is Kind.VOID:  # llama-server skips a non-truthy value
        return ("1", entry.env) if is_truthy(raw) else None
    return raw, entry.env


def _read_argv(
    b: Builder, argv: Sequence[str], index: Mapping[str, tuple[Flag, bool]], ignored: list[str]
) -> None:
    i = 0
    while i < len(argv):
        name = argv[i].replace("_", "-") if argv[i].startswith("--") else argv[i]
        hit = index.get(name)
        if hit is None:
            raise ConfigError(f"error: invalid argument: {name}")
        entry, positive = hit
        if entry.group is Group.INFO:
            raise HelpRequested(name)
        n_values = {Kind.VOID: 0, Kind.TOGGLE: 0, Kind.VALUE: 1, Kind.PAIR: 2}[entry.kind]
        if entry.removed is not None:  # fails naming the replacement, with or without a value
            _apply(b, entry, "", f'argument "{name}"', name, ignored)
        if i + n_values >= len(argv):
            raise ConfigError(
                f'error while handling argument "{name}": expected value for argument'
            )
        if entry.kind is Kind.TOGGLE:
            value = "1" if positive else "0"
        else:
            value = " ".join(argv[i + 1 : i + 1 + n_values]) or "1"
        _apply(b, entry, value, f'argument "{name}"', name, ignored)
        i += 1 + n_values


def _apply(
    b: Builder, entry: Flag, value: str, source: str, spelled: str, ignored: list[str]
) -> None:
    if entry.removed is not None:
        raise ConfigError(
            f"error while handling {source}: the argument has been removed. {entry.removed}"
        )
    if entry.apply is None:
        if spelled not in ignored:
            ignored.append(spelled)
        return
    b.given.add(entry.primary)
    b.source = source
    try:
        entry.apply(b, value)
    except ValueError as e:
        raise ConfigError(f"error while handling {source}: {e}") from e


def _threads(raw: int | None, fallback: int, host: MachineInfo) -> int:
    """llama-server: unset takes the fallback; <= 0 means all logical CPUs."""
    if raw is None:
        return fallback
    return raw if raw > 0 else host.n_cpu_logical


def _finish(b: Builder, host: MachineInfo, ignored: list[str]) -> ServerConfig:
    n_threads = _threads(b.threads.get("-t"), host.n_cpu_physical, host)
    n_threads_batch = _threads(b.threads.get("-tb"), n_threads, host)
    b.update("context", n_threads=n_threads, n_threads_batch=n_threads_batch)
    b.update(
        "spec",
        n_threads_draft=_threads(b.threads.get("-td"), n_threads, host),
        n_threads_batch_draft=_threads(b.threads.get("-tbd"), n_threads_batch, host),
    )
    per_slot = b.context.kv_unified_per_slot
    if per_slot > 0 and "-c" not in b.given:  # -c, even -c 0, pins the pool (llama-server)
        b.update("context", n_ctx=b.context.n_parallel_resolved * per_slot)
    if b.escape:
        breakers = tuple(process_escapes(s) for s in b.sampling.dry_sequence_breakers)
        b.update("sampling", dry_sequence_breakers=breakers)
    b.update("model", alias=b.model.aliases[0] if b.model.aliases else None)
    b.update("spec", spec_type=_spec_type(b))
    static_path = b.http.static_path
    if b.http.webui and static_path is not None and not os.path.isdir(static_path):
        raise ConfigError(f"--path: static assets path not found: {static_path}")
    table_cors.cors_origins_default(b)
    if (b.http.ssl_key_file is None) != (b.http.ssl_cert_file is None):
        given = "--ssl-key-file" if b.http.ssl_key_file is not None else "--ssl-cert-file"
        raise ConfigError(
            f"{given} needs its pair: HTTPS takes both --ssl-key-file and --ssl-cert-file "
            "(kvswap never serves plain HTTP where TLS was asked for)"
        )
    table_cluster.check(b)
    return ServerConfig(
        model=b.model,
        context=b.context,
        sampling=b.sampling,
        http=b.http,
        paging=b.paging,
        spec=b.spec,
        log=b.log,
        cluster=b.cluster,
        state=b.state,
        ignored_flags=tuple(ignored),
    )


def _spec_type(b: Builder) -> str:
    """The one speculative type kvswap runs, from every --spec-type / --spec-default given."""
    supported = ", ".join(SUPPORTED_SPEC_TYPES)
    chosen: dict[str, str] = {}
    for spec_type, source in b.spec_types:
        if spec_type not in SUPPORTED_SPEC_TYPES:
            raise ConfigError(
                f"error while handling {source}: speculative type '{spec_type}' is not "
                f"supported by kvswap (supported: {supported})"
            )
        if spec_type != "none":
            chosen.setdefault(spec_type, source)
    if len(chosen) > 1:
        raise ConfigError(
            f"--spec-type: kvswap runs one speculative type at a time, got {', '.join(chosen)}"
        )
    spec_type = next(iter(chosen), "none")
    if spec_type == "draft-simple" and b.spec.model_draft is None:
        raise ConfigError(
            "--spec-type draft-simple needs a draft model: -md/--model-draft/--spec-draft-model"
        )
    return spec_type
