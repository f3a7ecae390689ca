"""parse_serve_args: aliases, environment variables, precedence and the ways a flag fails."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kvswap.config import (
    ConfigError,
    HelpRequested,
    LoraSpec,
    MachineInfo,
    ServerConfig,
    format_help,
    parse_serve_args,
)
from kvswap.config.flags import all_flags

HOST = MachineInfo(physical_ram_bytes=16 << 30, n_cpu_physical=4, n_cpu_logical=8)


def parse(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> ServerConfig:
    return parse_serve_args(list(argv), env or {}, machine=HOST)


def fails(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        parse(argv, env)
    return str(err.value)


@pytest.mark.parametrize("spelling", ["-c", "--ctx-size", "--ctx_size"])
def test_ctx_size_spellings(spelling: str) -> None:
    assert parse([spelling, "4096"]).context.n_ctx == 4096


@pytest.mark.parametrize("spelling", ["-ngl", "--gpu-layers", "--n-gpu-layers"])
def test_gpu_layers_spellings_and_words(spelling: str) -> None:
    assert parse([spelling, "12"]).model.n_gpu_layers == 12
    assert parse([spelling, "auto"]).model.n_gpu_layers == -1
    assert parse([spelling, "all"]).model.n_gpu_layers == -2


@pytest.mark.parametrize(
    ("argv", "section", "field", "value"),
    [
        (["-n", "7"], "sampling", "n_predict", 7),
        (["--predict", "7"], "sampling", "n_predict", 7),
        (["--n-predict", "7"], "sampling", "n_predict", 7),
        (["-np", "2"], "context", "n_parallel", 2),
        (["--parallel", "-1"], "context", "n_parallel", -1),
        (["-ctxcp", "3"], "context", "ctx_checkpoints", 3),
        (["--swa-checkpoints", "3"], "context", "ctx_checkpoints", 3),
        (["-cms", "0"], "context", "checkpoint_min_step", 0),
        (["-kvu"], "context", "kv_unified", True),
        (["--no-kv-unified"], "context", "kv_unified", False),
        (["-fa", "on"], "context", "flash_attn", "on"),
        (["--flash-attn", "disabled"], "context", "flash_attn", "off"),
        (["-fa", "-1"], "context", "flash_attn", "auto"),
        (["-ctk", "q8_0", "-ctv", "q4_0"], "context", "cache_type_v", "q4_0"),
        (["--temperature", "-3"], "sampling", "temperature", 0.0),  # clamped as llama-server
        (["--typical-p", "0.5"], "sampling", "typical_p", 0.5),
        (["--top-n-sigma", "2"], "sampling", "top_n_sigma", 2.0),
        (["--dry-base", "0.5"], "sampling", "dry_base", 1.75),  # < 1 ignored as llama-server
        (["--mirostat-lr", "0.2"], "sampling", "mirostat_eta", 0.2),
        (["-s", "42"], "sampling", "seed", 42),
        (["--seed", "4294967295"], "sampling", "seed", -1),
        (["--sampling-seq", "kt"], "sampling", "samplers", ("top_k", "temperature")),
        (
            ["--samplers", "Top-K;nucleus;temp"],
            "sampling",
            "samplers",
            ("top_k", "top_p", "temperature"),
        ),
        (
            ["-l", "15043+1", "--logit-bias", "2-inf"],
            "sampling",
            "logit_bias",
            ((15043, 1.0), (2, float("-inf"))),
        ),
        (["-md", "d.gguf"], "spec", "model_draft", "d.gguf"),
        (["--spec-draft-model", "d.gguf"], "spec", "model_draft", "d.gguf"),
        (["-ngld", "all"], "spec", "n_gpu_layers_draft", -2),
        (["-ctkd", "q8_0"], "spec", "cache_type_k_draft", "q8_0"),
        (["--cache-type-v-draft", "bf16"], "spec", "cache_type_v_draft", "bf16"),
        (["--draft-p-min", "0.75"], "spec", "p_min", 0.75),
        (["--spec-draft-n-max", "16", "--spec-draft-n-min", "2"], "spec", "n_min", 2),
        (["-lv", "5"], "log", "verbosity", 5),
        (["--log-verbosity", "1"], "log", "verbosity", 1),
        (["-v"], "log", "verbose", True),
        (["-lm", "mmap+mlock"], "model", "load_mode", "mmap+mlock"),
        (["-cram", "-1"], "paging", "cache_ram_mib", -1),
        (["-sps", "0.5"], "paging", "slot_prompt_similarity", 0.5),
        (["--sleep-idle-seconds", "30"], "paging", "sleep_idle_seconds", 30),
        (["--page-disk-bytes", "20e9"], "paging", "page_disk_bytes", 20_000_000_000),
        (["--ctx-checkpoints-bytes", "512M"], "context", "ctx_checkpoints_bytes", 512 << 20),
        (["--max-body-bytes", "1k"], "http", "max_body_bytes", 1024),
        (["--no-slots"], "http", "slots_endpoint", False),
        (["--metrics", "--props"], "http", "props_write", True),
        (["-to", "5", "--port", "0"], "http", "port", 0),
    ],
)
def test_flag_sets_its_field(argv: list[str], section: str, field: str, value: object) -> None:
    assert getattr(getattr(parse(argv), section), field) == value


def test_no_warmup_turns_the_load_time_decode_off() -> None:
    assert parse(["--no-warmup"]).model.warmup is False
    assert parse(["--no-warmup", "--warmup"]).model.warmup is True
    assert "--no-warmup" not in parse(["--no-warmup"]).ignored_flags


def test_later_flag_wins_and_underscores_read_as_dashes() -> None:
    cfg = parse(["-c", "100", "--ctx_size", "200", "--batch_size", "64"])
    assert (cfg.context.n_ctx, cfg.context.n_batch) == (200, 64)


def test_env_vars_fill_settings() -> None:
    env = {
        "LLAMA_ARG_CTX_SIZE": "8192",
        "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_KV_UNIFIED": "true",
        "LLAMA_ARG_CONTEXT_SHIFT": "on",
        "LLAMA_ARG_ENDPOINT_METRICS": "1",
        "LLAMA_ARG_SPEC_DRAFT_P_MIN": "0.5",
        "LLAMA_ARG_N_GPU_LAYERS": "all",
        "LLAMA_ARG_MODEL": "/m.gguf",
        "LLAMA_ARG_HOST": "0.0.0.0",
        "KVSWAP_ARG_PAGE_RAM_BYTES": "1G",
    }
    cfg = parse([], env)
    assert (cfg.context.n_ctx, cfg.context.n_parallel, cfg.context.kv_unified) == (8192, 2, True)
    assert cfg.context.context_shift is True and cfg.http.metrics is True
    assert (cfg.spec.p_min, cfg.model.n_gpu_layers, cfg.model.path) == (0.5, -2, "/m.gguf")
    assert cfg.http.host == "0.0.0.0" and cfg.paging.page_ram_bytes == 1 << 30


def test_command_line_beats_env_beats_default() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_PORT": "9000"}
    cfg = parse(["-c", "1024"], env)
    assert (cfg.context.n_ctx, cfg.http.port) == (1024, 9000)
    assert parse(["--no-kv-unified"], {"LLAMA_ARG_KV_UNIFIED": "1"}).context.kv_unified is False
    assert parse([], {}).http.port == 8080


def test_negative_env_var_and_void_env_semantics() -> None:
    assert parse([], {"LLAMA_ARG_NO_ENDPOINT_SLOTS": ""}).http.slots_endpoint is False
    assert parse([], {"LLAMA_ARG_NO_KV_UNIFIED": "1"}).context.kv_unified is False
    # A flag without a value is applied by a truthy env value and skipped otherwise.
    assert parse([], {"LLAMA_ARG_SWA_FULL": "enabled"}).context.swa_full is True
    assert parse([], {"LLAMA_ARG_SWA_FULL": "no"}).context.swa_full is False
    assert "LLAMA_ARG_KV_UNIFIED" in fails([], {"LLAMA_ARG_KV_UNIFIED": "maybe"})
    assert "invalid boolean" in fails([], {"LLAMA_ARG_KV_UNIFIED": "maybe"})


def test_bad_env_value_names_the_variable() -> None:
    message = fails([], {"LLAMA_ARG_CTX_SIZE": "big"})
    assert message.startswith('error while handling environment variable "LLAMA_ARG_CTX_SIZE"')


def test_unknown_flag_fails_like_llama_server() -> None:
    assert fails(["--no-such-flag"]) == "error: invalid argument: --no-such-flag"
    assert fails(["model.gguf"]) == "error: invalid argument: model.gguf"
    assert fails(["--port=8080"]) == "error: invalid argument: --port=8080"
    assert fails(["--mlock"]) == "error: invalid argument: --mlock"  # gone from the pinned tree


def test_missing_and_malformed_values_name_the_flag() -> None:
    expected = 'error while handling argument "--port": expected value for argument'
    assert fails(["--port"]) == expected
    assert fails(["-c", "12abc"]).startswith('error while handling argument "-c":')
    assert "--top-p" in fails(["--top-p", "nan"])
    assert "Unsupported cache type: q3_k" in fails(["-ctk", "q3_k"])
    assert "--flash-attn" in fails(["--flash-attn", "sometimes"])
    assert "--port" in fails(["--port", "70000"])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-np", "0"], "invalid value for n_parallel"),
        (["-cms", "-1"], "checkpoint-min-step must be non-negative"),
        (["--sleep-idle-seconds", "0"], "cannot be 0 or less than -1"),
        (["--sleep-idle-seconds", "-2"], "cannot be 0 or less than -1"),
        (["--repeat-last-n", "-1"], "--repeat-last-n"),
        (["--dry-penalty-last-n", "-1"], "--dry-penalty-last-n"),
        (["--repeat-penalty", "0"], "repeat-penalty must be finite and greater than 0"),
        (["--spec-draft-n-max", "-1"], "--spec-draft-n-max"),
        (["--spec-ngram-simple-size-n", "0"], "between 1 and 1024"),
        (["--spec-ngram-simple-min-hits", "0"], "--spec-ngram-simple-min-hits"),
        (["-c", "-5"], '"-c"'),
        (["-b", "0"], '"-b"'),
        (["--kv-unified-per-slot", "-1"], "--kv-unified-per-slot"),
        (["--seed", "-2"], "--seed"),
        (["--lora-scaled", "a.gguf"], "lora-scaled format: FNAME:SCALE"),
        (["-lm", "fast"], "expected one of auto, none, mmap"),
        (["--host", " , "], "--host requires at least one address"),
        (["--samplers", "top_k;bogus"], "unknown sampler 'bogus'"),
        (["--sampler-seq", "kq"], "unknown sampler letter"),
        (["-l", "15043*2"], "TOKEN_ID(+/-)BIAS"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-n-predict", "-2"], "--max-n-predict"),
    ],
)
def test_ranges_llama_server_validates(argv: list[str], needle: str) -> None:
    message = fails(argv)
    assert needle in message
    assert f'argument "{argv[0]}"' in message


@pytest.mark.parametrize(
    ("argv", "replacement"),
    [
        (["--draft-max", "8"], "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        (["--draft", "8"], "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        (["--draft-n", "8"], "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
        (["--draft-min", "1"], "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
        (["--draft-n-min", "1"], "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
        (["--spec-ngram-size-n", "3"], "use the respective --spec-ngram-*-size-n"),
        (["--spec-ngram-size-m", "3"], "use the respective --spec-ngram-*-size-m"),
        (["--spec-ngram-min-hits", "3"], "use the respective --spec-ngram-*-min-hits"),
        (["--draft-max"], "use --spec-draft-n-max or --spec-ngram-mod-n-max"),  # no value
    ],
)
def test_removed_flags_name_their_replacement(argv: list[str], replacement: str) -> None:
    assert fails(argv) == (
        f'error while handling argument "{argv[0]}": the argument has been removed. {replacement}'
    )


def test_removed_flag_env_var_fails_too() -> None:
    message = fails([], {"LLAMA_ARG_DRAFT_MAX": "8"})
    assert message == (
        'error while handling environment variable "LLAMA_ARG_DRAFT_MAX": '
        "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max"
    )


def test_draft_gpu_layers_is_not_removed() -> None:
    assert parse(["-ngld", "3"]).spec.n_gpu_layers_draft == 3


@pytest.mark.parametrize(
    "spec_type",
    [
        "draft-eagle3",
        "draft-mtp",
        "draft-dflash",
        "draft-dspark",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    ],
)
def test_unsupported_spec_types_name_what_is_supported(spec_type: str) -> None:
    message = fails(["--spec-type", spec_type, "-md", "d.gguf"])
    assert spec_type in message
    assert "supported: none, draft-simple, ngram-simple" in message


def test_supported_spec_types() -> None:
    assert parse(["--spec-type", "ngram-simple"]).spec.spec_type == "ngram-simple"
    cfg = parse(["--spec-type", "draft-simple", "-md", "d.gguf"])
    assert (cfg.spec.spec_type, cfg.spec.model_draft) == ("draft-simple", "d.gguf")
    assert parse(["--spec-type", "none"]).spec.spec_type == "none"
    # As the pinned llama-server, a draft model alone does not turn drafting on.
    assert parse(["-md", "d.gguf"]).spec.spec_type == "none"
    assert parse([], {"LLAMA_ARG_SPEC_TYPE": "ngram-simple"}).spec.spec_type == "ngram-simple"


def test_spec_type_errors() -> None:
    assert "unknown speculative type: eagle" in fails(["--spec-type", "eagle"])
    assert "needs a draft model" in fails(["--spec-type", "draft-simple"])
    assert "one speculative type at a time" in fails(
        ["--spec-type", "ngram-simple,draft-simple", "-md", "d.gguf"]
    )
    assert "'ngram-mod'" in fails(["--spec-default"])
    assert "LLAMA_ARG_SPEC_TYPE" in fails([], {"LLAMA_ARG_SPEC_TYPE": "draft-mtp"})


def test_ignored_flags_are_consumed_and_listed_once_in_order() -> None:
    words = "--mmproj p.gguf --numa distribute -cb --perf --reasoning-format x"
    argv = [*words.split(), "-fit", "off", "--control-vector-layer-range", "1", "4"]
    argv += ["--mmproj", "q.gguf", "-c", "512"]
    cfg = parse(argv, {"LLAMA_ARG_NO_CONT_BATCHING": "1", "HF_TOKEN": "t"})
    assert cfg.ignored_flags == (
        "LLAMA_ARG_NO_CONT_BATCHING",
        "HF_TOKEN",
        "--mmproj",
        "--numa",
        "-cb",
        "--perf",
        "--reasoning-format",
        "-fit",
        "--control-vector-layer-range",
    )
    assert cfg.context.n_ctx == 512


def test_rope_yarn_and_override_kv_are_read_as_llama_server_reads_them() -> None:
    """Context extension flags reach libllama (they were accepted and ignored): each sets
    one field of the context params (`--rope-scale N` a frequency scale of 1/N), the later
    flag wins; `--override-kv` items accumulate; a bad one fails naming the flag."""
    rope = ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "8192"]
    overrides = ["--override-kv", "llama.context_length=int:32768,a.b=bool:true"]
    cfg = parse([*rope, *overrides, "--override-kv", "c=str:x", "--rope-freq-scale", "0.5"])
    assert dict(cfg.context.rope) == {
        "rope_scaling_type": 2,
        "rope_freq_scale": 0.5,
        "yarn_orig_ctx": 8192,
    }
    assert cfg.model.kv_overrides == ("llama.context_length=int:32768", "a.b=bool:true", "c=str:x")
    assert cfg.ignored_flags == ()
    assert "--override-kv" in fails(["--override-kv", "llama.context_length=32768"])
    assert "--rope-scaling" in fails(["--rope-scaling", "ntk"])
    assert "--override-kv" in fails(["--override-kv", "k=bool:yes"])


def test_api_keys_from_list_file_and_env(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_text("# comment\nk3\n\nk4\r\n")
    cfg = parse(
        ["--api-key", 'k1,"k,2",', "--api-key-file", str(key_file)], {"LLAMA_API_KEY": "k0"}
    )
    assert cfg.http.api_keys == ("k0", "k1", "k,2", "k3", "k4")
    assert parse([], {"LLAMA_ARG_API_KEY_FILE": str(key_file)}).http.api_keys == ("k3", "k4")
    message = fails(["--api-key-file", str(tmp_path / "missing")])
    assert message.startswith('error while handling argument "--api-key-file": failed to open')


def test_lora_lists(tmp_path: Path) -> None:
    cfg = parse(["--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5,d.gguf:2", "--lora", "e"])
    assert cfg.model.lora == (
        LoraSpec("a.gguf", 1.0),
        LoraSpec("b.gguf", 1.0),
        LoraSpec("c.gguf", 0.5),
        LoraSpec("d.gguf", 2.0),
        LoraSpec("e", 1.0),
    )
    assert parse(["--lora-init-without-apply"]).model.lora_init_without_apply is True


def test_aliases_tags_and_hosts() -> None:
    cfg = parse(["-a", "zeta, alpha", "--alias", "alpha,mid", "--tags", "b,a"])
    assert cfg.model.aliases == ("alpha", "mid", "zeta")
    assert cfg.model.alias == "alpha"  # the first of llama-server's sorted set
    assert cfg.model.tags == ("a", "b")
    cfg = parse(["--host", "0.0.0.0, ::1"])
    assert (cfg.http.host, cfg.http.hosts) == ("0.0.0.0", ("0.0.0.0", "::1"))


def test_slot_save_path_and_chat_template_file(tmp_path: Path) -> None:
    assert parse(["--slot-save-path", str(tmp_path)]).http.slot_save_path == str(tmp_path)
    assert "not a directory" in fails(["--slot-save-path", str(tmp_path / "nope")])
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    cfg = parse(["--chat-template", "chatml", "--chat-template-file", str(template)])
    assert (cfg.model.chat_template, cfg.model.chat_template_file) == (None, str(template))
    cfg = parse(["--chat-template-file", str(template), "--chat-template", "chatml"])
    assert (cfg.model.chat_template, cfg.model.chat_template_file) == ("chatml", None)
    assert "failed to open file" in fails(["--chat-template-file", str(tmp_path / "x.jinja")])


def test_kv_unified_per_slot_sizes_the_pool_unless_c_is_given() -> None:
    assert parse(["--kv-unified-per-slot", "1000"]).context.n_ctx == 4000  # auto: 4 slots
    assert parse(["-np", "3", "--kv-unified-per-slot", "1000"]).context.n_ctx == 3000
    assert parse(["-c", "0", "--kv-unified-per-slot", "1000"]).context.n_ctx == 0
    assert parse(["-c", "5000", "--kv-unified-per-slot", "1000"]).context.n_ctx == 5000


def test_kv_unified_resolution() -> None:
    assert parse(["-np", "2"]).context.kv_unified_resolved is False
    assert parse(["-np", "2", "-kvu"]).context.kv_unified_resolved is True
    # llama-server forces unified KV with auto slots, even against -no-kvu.
    assert parse(["-no-kvu"]).context.kv_unified_resolved is True


def test_escapes_in_dry_sequence_breakers() -> None:
    cfg = parse(["--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "x\\ty"])
    assert cfg.sampling.dry_sequence_breakers == ("\n", "x\ty")
    cfg = parse(["--no-escape", "--dry-sequence-breaker", "\\n"])
    assert cfg.sampling.dry_sequence_breakers == ("\\n",)
    assert parse(["--dry-sequence-breaker", "none"]).sampling.dry_sequence_breakers == ()


def test_verbose_and_verbosity_last_wins() -> None:
    assert parse(["-v"]).log.verbosity == (1 << 31) - 1
    assert parse(["-v", "-lv", "2"]).log.verbosity == 2
    assert parse(["--log-disable", "--log-file", "x.log"]).log.log_file == "x.log"


def test_load_mode_drives_mmap_and_mlock() -> None:
    assert (parse(["-lm", "none"]).model.use_mmap, parse(["-lm", "none"]).model.use_mlock) == (
        False,
        False,
    )
    assert parse(["-lm", "mlock"]).model.use_mlock is True


@pytest.mark.parametrize("spelling", ["-h", "--help", "--usage", "--version", "--list-devices"])
def test_help_and_version_are_handed_to_the_caller(spelling: str) -> None:
    with pytest.raises(HelpRequested) as err:
        parse(["-c", "1", spelling, "--bogus"])
    assert err.value.flag == spelling


def test_format_help_lists_flags_envs_and_sections() -> None:
    text = format_help()
    assert text.startswith("usage: kvswap serve")
    for needle in (
        "-c, --ctx-size N",
        "LLAMA_ARG_CTX_SIZE",
        "-kvu, --kv-unified, -no-kvu, --no-kv-unified",
        "--page-ram-bytes SIZE",
        "KVSWAP_ARG_PAGE_RAM_BYTES",
        "----- removed params",
        "--draft, --draft-n, --draft-max",
        "----- accepted for llama-server compatibility, ignored by kvswap -----",
        "-mm, --mmproj",
    ):
        assert needle in text


def _help_sections() -> list[tuple[str, str]]:
    """(heading, body) of each `----- heading -----` section of the help, in order."""
    parts = re.split(r"^----- (.+) -----$", format_help(), flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_help_starts_with_kvswaps_own_flags_in_groups() -> None:
    """A minds user reads kvswap's flags first: every flag llama-server lacks (its variable is
    KVSWAP_ARG_*) is in the first sections, headed as kvswap's, each about minds."""
    sections = _help_sections()
    n_own = next(i for i, (heading, _) in enumerate(sections) if not heading.endswith("(kvswap)"))
    own, rest = sections[:n_own], sections[n_own:]
    assert len(own) >= 3 and all("minds" in h or "request" in h for h, _ in own), own
    own_text = "".join(body for _, body in own)
    rest_text = "".join(body for _, body in rest)
    kvswap_flags = [f for f in all_flags() if f.env and f.env.startswith("KVSWAP_ARG_")]
    assert len(kvswap_flags) >= 13
    for f in kvswap_flags:
        assert re.search(rf"^{re.escape(f.primary)}\b", own_text, re.M), f.primary
        assert not re.search(rf"^{re.escape(f.primary)}\b", rest_text, re.M), f.primary
    # Next, llama-server's flags that decide how far a mind grows and where it waits.
    heading, body = rest[0]
    assert heading == "llama-server's flags that matter to minds"
    for spelling in ("-c, --ctx-size", "-np, --parallel", "-kvu, --kv-unified", "--slot-save-path"):
        entry = body[body.index(spelling) :].split("\n\n")[0]
        assert "mind" in entry, entry
    # The example server is above the first section, the help's first screen.
    head = format_help().split("-----")[0]
    assert "kvswap serve -c 8192 -np 4 -kvu --slot-save-path ./slots" in head


def test_every_flag_is_in_the_help_once() -> None:
    text = format_help()
    for f in all_flags():
        head = ", ".join(f.names + f.neg)
        assert len(re.findall(rf"^{re.escape(head)}(?: |$)", text, re.M)) == 1, head


def test_jinja_is_what_kvswap_does_and_is_not_reported_ignored() -> None:
    cfg = parse(["--jinja"], {})
    assert cfg.ignored_flags == ()
    assert parse([], {"LLAMA_ARG_JINJA": "1"}).ignored_flags == ()


def test_chat_template_kwargs_accumulate_and_must_be_a_json_object() -> None:
    cfg = parse(
        ["--chat-template-kwargs", '{"a": 1, "b": "x"}', "--chat-template-kwargs", '{"a": [2]}'],
        {},
    )
    assert dict(cfg.model.chat_template_kwargs) == {"a": "[2]", "b": '"x"'}
    for bad in ("[1]", "{oops"):
        with pytest.raises(ConfigError, match="--chat-template-kwargs"):
            parse(["--chat-template-kwargs", bad], {})


def test_tls_takes_both_files_or_refuses_to_start(tmp_path: Path) -> None:
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    key.write_text("k")
    cert.write_text("c")
    cfg = parse(["--ssl-key-file", str(key), "--ssl-cert-file", str(cert)], {})
    assert (cfg.http.ssl_key_file, cfg.http.ssl_cert_file) == (str(key), str(cert))
    assert cfg.ignored_flags == ()
    with pytest.raises(ConfigError, match="--ssl-cert-file needs its pair"):
        parse(["--ssl-cert-file", str(cert)], {})
    with pytest.raises(ConfigError, match="failed to open file"):
        parse(["--ssl-key-file", str(tmp_path / "none.pem"), "--ssl-cert-file", str(cert)], {})
