"""With no flags and no environment, every setting is the pinned llama-server's default.

The expected values are copied from llama.cpp's common/common.h and common/arg.cpp of the tree
vendored in llama-cpp-python 0.3.36 (and tools/server/server.cpp for the auto rules).
"""

from __future__ import annotations

import os

import pytest

from kvswap.config import MachineInfo, PagingSettings, ServerConfig, parse_serve_args

GIB = 1 << 30
HOST = MachineInfo(physical_ram_bytes=64 * GIB, n_cpu_physical=8, n_cpu_logical=16)


@pytest.fixture
def config() -> ServerConfig:
    return parse_serve_args([], {}, machine=HOST)


def test_model_defaults(config: ServerConfig) -> None:
    m = config.model
    assert m.path is None  # the embedded SmolLM2 model
    assert m.alias is None and m.aliases == () and m.tags == ()
    assert m.n_gpu_layers == -1  # 'auto'
    assert m.load_mode == "auto" and m.use_mmap is True and m.use_mlock is False
    assert m.chat_template is None and m.chat_template_file is None
    assert m.warmup is True  # an empty decode at load, as llama-server (--no-warmup: none)
    assert m.lora == () and m.lora_init_without_apply is False


def test_context_defaults(config: ServerConfig) -> None:
    c = config.context
    assert (c.n_ctx, c.n_parallel, c.kv_unified, c.kv_unified_per_slot) == (0, -1, None, 0)
    assert (c.n_batch, c.n_ubatch) == (2048, 512)
    assert (c.cache_type_k, c.cache_type_v) == ("f16", "f16")
    assert (c.n_threads, c.n_threads_batch) == (8, 8)  # physical cores; batch = same as -t
    assert c.flash_attn == "auto"
    assert c.swa_full is False
    assert (c.ctx_checkpoints, c.checkpoint_min_step, c.ctx_checkpoints_bytes) == (32, 8192, 0)
    assert c.n_keep == 0
    assert c.context_shift is False
    assert c.cache_prompt is True
    # -np auto: 4 slots with unified KV, as llama-server decides before loading the model.
    assert c.n_parallel_resolved == 4 and c.kv_unified_resolved is True


def test_sampling_defaults(config: ServerConfig) -> None:
    s = config.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (s.repeat_last_n, s.repeat_penalty) == (64, 1.0)
    assert (s.presence_penalty, s.frequency_penalty) == (0.0, 0.0)
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (
        0.0,
        1.75,
        2,
        64,
    )
    assert s.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (s.xtc_probability, s.xtc_threshold, s.top_n_sigma) == (0.0, 0.1, -1.0)
    assert (s.dynatemp_range, s.dynatemp_exponent) == (0.0, 1.0)
    assert (s.adaptive_target, s.adaptive_decay) == (-1.0, 0.9)
    assert (s.mirostat, s.mirostat_tau, s.mirostat_eta) == (0, 5.0, 0.1)
    assert s.seed == -1  # LLAMA_DEFAULT_SEED: random
    assert (s.n_predict, s.n_probs, s.ignore_eos, s.logit_bias) == (-1, 0, False, ())
    assert s.samplers == (
        "penalties",
        "dry",
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    )


def test_http_defaults(config: ServerConfig) -> None:
    h = config.http
    assert (h.host, h.hosts, h.port) == ("127.0.0.1", ("127.0.0.1",), 8080)
    assert h.api_keys == ()
    assert (h.timeout_s, h.n_threads_http) == (3600, -1)
    assert (h.metrics, h.slots_endpoint, h.props_write) == (False, True, False)
    assert (h.slot_save_path, h.api_prefix) == (None, "")
    assert (h.max_body_bytes, h.max_n_predict) == (32 << 20, -1)


def test_paging_defaults(config: ServerConfig) -> None:
    p = config.paging
    assert p.page_ram_bytes == 8 * GIB  # min(64 GiB / 4, 8 GiB)
    assert p.page_disk_bytes is None
    assert (p.cache_ram_mib, p.slot_prompt_similarity, p.sleep_idle_seconds) == (8192, 0.1, -1)


def test_spec_defaults(config: ServerConfig) -> None:
    sp = config.spec
    assert (sp.spec_type, sp.model_draft) == ("none", None)
    assert (sp.n_max, sp.n_min, sp.p_min) == (3, 0, 0.0)
    assert (sp.cache_type_k_draft, sp.cache_type_v_draft) == ("f16", "f16")
    assert sp.n_gpu_layers_draft == -1
    assert (sp.n_threads_draft, sp.n_threads_batch_draft) == (8, 8)
    assert (sp.ngram_size_n, sp.ngram_size_m, sp.ngram_min_hits) == (12, 48, 1)


def test_log_defaults_and_nothing_ignored(config: ServerConfig) -> None:
    assert (config.log.verbose, config.log.verbosity) == (False, 3)
    assert (config.log.log_disable, config.log.log_file) == (False, None)
    assert config.ignored_flags == ()


@pytest.mark.parametrize(
    ("ram_bytes", "expected"),
    [
        (64 * GIB, 8 * GIB),  # capped at 8 GiB
        (32 * GIB, 8 * GIB),  # exactly 25%
        (16 * GIB, 4 * GIB),
        (2 * GIB + 3, (2 * GIB + 3) // 4),  # rounded down
    ],
)
def test_page_ram_bytes_default_is_a_quarter_of_ram_capped_at_8_gib(
    ram_bytes: int, expected: int
) -> None:
    host = MachineInfo(physical_ram_bytes=ram_bytes, n_cpu_physical=2, n_cpu_logical=4)
    assert parse_serve_args([], {}, machine=host).paging.page_ram_bytes == expected


def test_page_ram_bytes_default_on_this_host() -> None:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    expected = min(ram // 4, 8 * GIB)
    assert MachineInfo.probe().physical_ram_bytes == ram
    assert parse_serve_args([], {}).paging.page_ram_bytes == expected
    assert PagingSettings().page_ram_bytes == expected


def test_thread_defaults_follow_llama_server_rules() -> None:
    def threads(*argv: str) -> tuple[int, int, int, int]:
        cfg = parse_serve_args(list(argv), {}, machine=HOST)
        c, sp = cfg.context, cfg.spec
        return c.n_threads, c.n_threads_batch, sp.n_threads_draft, sp.n_threads_batch_draft

    assert threads() == (8, 8, 8, 8)
    assert threads("-t", "3") == (3, 3, 3, 3)  # -tb, -td, -tbd follow -t
    assert threads("-t", "3", "-tb", "5") == (3, 5, 3, 5)  # -tbd follows -tb (as the code)
    assert threads("-t", "0") == (16, 16, 16, 16)  # <= 0: every logical CPU
    assert threads("-t", "-1", "-tb", "2", "-td", "1", "-tbd", "0") == (16, 2, 1, 16)
