"""The frozen settings `kvswap serve` runs with, one dataclass per component.

Owns the shape and the defaults of kvswap's configuration. `flags.parse_serve_args` builds a
`ServerConfig` once at start-up; each component receives only its slice (`ModelSettings` for the
backend, `ContextSettings` for the engine, ...). A live reconfigure builds new instances with
`dataclasses.replace`; nothing is mutated in place. No I/O here, except that the defaults of
thread counts and of the page store ceiling probe the host (`machine.MachineInfo`) when a
dataclass is built without them.

Defaults are the pinned llama-server's (llama.cpp `common/common.h`, `common/arg.cpp`,
`tools/server/server.cpp`) unless a comment says "kvswap-only".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvswap.config.machine import MachineInfo
from kvswap.core.sampling import DEFAULT_DRY_SEQUENCE_BREAKERS, DEFAULT_SAMPLERS

N_PARALLEL_AUTO_SLOTS = 4  # llama-server: -np auto (-1) means 4 slots with unified KV
N_GPU_LAYERS_AUTO = -1  # -ngl auto
N_GPU_LAYERS_ALL = -2  # -ngl all
VERBOSITY_ALL = (1 << 31) - 1  # -v: llama-server sets the threshold to INT_MAX

# -lm/--load-mode value -> (use_mmap, use_mlock) as libllama reads them.
_LOAD_MODE_MMAP_MLOCK: dict[str, tuple[bool, bool]] = {
    "auto": (True, False),  # mmap unless a device cannot; libllama decides
    "none": (False, False),
    "mmap": (True, False),
    "mlock": (False, True),
    "mmap+mlock": (True, True),
    "dio": (False, False),  # direct I/O
}
LOAD_MODES: tuple[str, ...] = tuple(_LOAD_MODE_MMAP_MLOCK)


def _probed_cpu_physical() -> int:
    return MachineInfo.probe().n_cpu_physical


def _probed_page_ram_bytes() -> int:
    return MachineInfo.probe().default_page_ram_bytes()


@dataclass(frozen=True)
class LoraSpec:
    """One LoRA adapter loaded at start-up."""

    path: str  # the adapter's GGUF file
    scale: float = 1.0  # --lora gives 1.0; --lora-scaled FILE:SCALE gives SCALE


@dataclass(frozen=True)
class ModelSettings:
    """What to load and how (the backend's slice)."""

    # -m/--model (LLAMA_ARG_MODEL); None: the embedded SmolLM2 default model.
    path: str | None = None
    # The API name of the model: the first of `aliases` in sorted order, as llama-server
    # (a std::set); None: the server derives it from the model path.
    alias: str | None = None
    # -a/--alias (LLAMA_ARG_ALIAS), comma-separated, stripped, deduplicated, sorted.
    aliases: tuple[str, ...] = ()
    # --tags (LLAMA_ARG_TAGS), comma-separated; informational, listed by /v1/models.
    tags: tuple[str, ...] = ()
    # -ngl/--gpu-layers/--n-gpu-layers (LLAMA_ARG_N_GPU_LAYERS): a layer count, or
    # -1 = 'auto' (llama-server's default: as many as fit) or -2 = 'all'.
    n_gpu_layers: int = N_GPU_LAYERS_AUTO
    # -lm/--load-mode (LLAMA_ARG_LOAD_MODE): auto | none | mmap | mlock | mmap+mlock | dio.
    # The pinned llama-server has no --mlock/--no-mmap any more; use_mmap and use_mlock below
    # are read from this.
    load_mode: str = "auto"
    # --chat-template (LLAMA_ARG_CHAT_TEMPLATE): a template text or a built-in name; None: the
    # GGUF's template. Set together with chat_template_file, the later flag wins (the other is
    # None), as llama-server keeps one template.
    chat_template: str | None = None
    # --chat-template-file (LLAMA_ARG_CHAT_TEMPLATE_FILE): path of a jinja template file.
    chat_template_file: str | None = None
    # --jinja/--no-jinja (LLAMA_ARG_JINJA): render chat templates with jinja; without it,
    # libllama's built-in formats render them, as llama-server (text.builtin_template).
    use_jinja: bool = True
    # --prefill-assistant/--no-prefill-assistant (LLAMA_ARG_PREFILL_ASSISTANT): a chat ending
    # with an assistant message continues it.
    prefill_assistant: bool = True
    # --override-kv: KEY=TYPE:VALUE items, the model's metadata as libllama loads it.
    kv_overrides: tuple[str, ...] = ()
    # -rea/--reasoning (LLAMA_ARG_REASONING): "on" | "off" | "auto" (from the template). "off"
    # renders with enable_thinking false and closes a thinking block the template opens.
    reasoning: str = "auto"
    # --chat-template-kwargs (LLAMA_ARG_CHAT_TEMPLATE_KWARGS): a JSON object's (key, value as
    # JSON text) pairs, the defaults under each request's own `chat_template_kwargs`.
    chat_template_kwargs: tuple[tuple[str, str], ...] = ()
    # --lora FILE[,FILE...] (scale 1.0) and --lora-scaled FILE:SCALE[,...], in flag order.
    lora: tuple[LoraSpec, ...] = ()
    # --lora-init-without-apply: load the adapters with scale 0 (apply via /lora-adapters).
    lora_init_without_apply: bool = False
    # --warmup/--no-warmup: one empty decode at load (weights faulted in, the graph allocated),
    # so the first request does not pay for it.
    warmup: bool = True

    @property
    def use_mmap(self) -> bool:
        """Map the weights (from `load_mode`)."""
        return _LOAD_MODE_MMAP_MLOCK[self.load_mode][0]

    @property
    def use_mlock(self) -> bool:
        """Lock the weights in RAM (from `load_mode`)."""
        return _LOAD_MODE_MMAP_MLOCK[self.load_mode][1]


@dataclass(frozen=True)
class ContextSettings:
    """The context geometry and per-slot policies (the engine's slice)."""

    # -c/--ctx-size (LLAMA_ARG_CTX_SIZE): the KV pool in tokens; 0 = the model's training
    # context. Without -c and with --kv-unified-per-slot N, the parser already set it to
    # n_parallel_resolved * N, as llama-server.
    n_ctx: int = 0
    # -np/--parallel (LLAMA_ARG_N_PARALLEL): slot count; -1 = auto (see n_parallel_resolved).
    n_parallel: int = -1
    # -kvu/--kv-unified, -no-kvu/--no-kv-unified (LLAMA_ARG_KV_UNIFIED); None = not given
    # (see kv_unified_resolved).
    kv_unified: bool | None = None
    # --kv-unified-per-slot (LLAMA_ARG_KV_UNIFIED_PER_SLOT): caps each slot's window at N
    # tokens; 0 = off.
    kv_unified_per_slot: int = 0
    # -b/--batch-size (LLAMA_ARG_BATCH): logical batch.
    n_batch: int = 2048
    # -ub/--ubatch-size (LLAMA_ARG_UBATCH): physical batch; also the per-step token budget.
    n_ubatch: int = 512
    # -ctk/--cache-type-k, -ctv/--cache-type-v (LLAMA_ARG_CACHE_TYPE_K/_V): a ggml type name
    # from values.KV_CACHE_TYPES.
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    # -t/--threads (LLAMA_ARG_THREADS): decode threads. Default: physical cores, as
    # llama-server's common_cpu_get_num_math; a value <= 0 means all logical CPUs.
    n_threads: int = field(default_factory=_probed_cpu_physical)
    # -tb/--threads-batch (no env var): prompt threads. Default: n_threads; <= 0 means all
    # logical CPUs.
    n_threads_batch: int = field(default_factory=_probed_cpu_physical)
    # -fa/--flash-attn (LLAMA_ARG_FLASH_ATTN): 'on' | 'off' | 'auto'.
    flash_attn: str = "auto"
    # --swa-full (LLAMA_ARG_SWA_FULL): full-size sliding-window cache (no checkpoints needed).
    swa_full: bool = False
    # --rope-scaling, --rope-scale, --rope-freq-base, --rope-freq-scale, --yarn-* (LLAMA_ARG_
    # ROPE_*, LLAMA_ARG_YARN_*): (field of libllama's context params, value) for each given.
    rope: tuple[tuple[str, float], ...] = ()
    # -ctxcp/--ctx-checkpoints/--swa-checkpoints (LLAMA_ARG_CTX_CHECKPOINTS): per slot.
    ctx_checkpoints: int = 32
    # -cms/--checkpoint-min-step (LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT): tokens between
    # checkpoints, >= 0; 0 = no minimum.
    checkpoint_min_step: int = 8192
    # kvswap-only --ctx-checkpoints-bytes (KVSWAP_ARG_CTX_CHECKPOINTS_BYTES): one byte budget
    # over every slot's checkpoints; 0 = off.
    ctx_checkpoints_bytes: int = 0
    # --keep (no env var): tokens of the prompt kept by context shift; -1 = all.
    n_keep: int = 0
    # --context-shift/--no-context-shift (LLAMA_ARG_CONTEXT_SHIFT): off in llama-server.
    context_shift: bool = False
    # --cache-prompt/--no-cache-prompt (LLAMA_ARG_CACHE_PROMPT): default of a request's
    # cache_prompt.
    cache_prompt: bool = True

    @property
    def n_parallel_resolved(self) -> int:
        """Slot count: n_parallel, or 4 when it is auto (-1), as llama-server."""
        return N_PARALLEL_AUTO_SLOTS if self.n_parallel < 0 else self.n_parallel

    @property
    def kv_unified_resolved(self) -> bool:
        """Unified KV as llama-server decides: always with auto n_parallel (it overrides even
        -no-kvu there), else the flag, else off."""
        if self.n_parallel < 0:
            return True
        return bool(self.kv_unified)


@dataclass(frozen=True)
class SamplingDefaults:
    """A request's sampling fields when it omits them (llama-server takes these from flags)."""

    temperature: float = 0.8  # --temp/--temperature (LLAMA_ARG_TEMPERATURE), clamped >= 0
    top_k: int = 40  # --top-k (LLAMA_ARG_TOP_K); <= 0: whole vocabulary
    top_p: float = 0.95  # --top-p (LLAMA_ARG_TOP_P); 1.0 = off
    min_p: float = 0.05  # --min-p (LLAMA_ARG_MIN_P); 0.0 = off
    typical_p: float = 1.0  # --typical/--typical-p; 1.0 = off
    repeat_last_n: int = 64  # --repeat-last-n, >= 0; 0 = off
    repeat_penalty: float = 1.0  # --repeat-penalty (LLAMA_ARG_REPEAT_PENALTY), > 0; 1.0 = off
    presence_penalty: float = 0.0  # --presence-penalty (LLAMA_ARG_PRESENCE_PENALTY)
    frequency_penalty: float = 0.0  # --frequency-penalty (LLAMA_ARG_FREQUENCY_PENALTY)
    dry_multiplier: float = 0.0  # --dry-multiplier; 0.0 = off
    dry_base: float = 1.75  # --dry-base; values < 1.0 are ignored, as llama-server
    dry_allowed_length: int = 2  # --dry-allowed-length
    dry_penalty_last_n: int = 64  # --dry-penalty-last-n, >= 0; 0 = off
    # --dry-sequence-breaker (repeatable; the first one clears the defaults; "none" = empty);
    # backslash escapes processed unless --no-escape.
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    xtc_probability: float = 0.0  # --xtc-probability; 0.0 = off
    xtc_threshold: float = 0.1  # --xtc-threshold; > 0.5 = off
    top_n_sigma: float = -1.0  # --top-nsigma/--top-n-sigma; -1.0 = off
    dynatemp_range: float = 0.0  # --dynatemp-range; 0.0 = off
    dynatemp_exponent: float = 1.0  # --dynatemp-exp
    adaptive_target: float = -1.0  # --adaptive-target; negative = off
    adaptive_decay: float = 0.9  # --adaptive-decay
    mirostat: int = 0  # --mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0
    mirostat_tau: float = 5.0  # --mirostat-ent
    mirostat_eta: float = 0.1  # --mirostat-lr
    # -s/--seed: -1 = a random seed per request (libllama's LLAMA_DEFAULT_SEED 0xFFFFFFFF,
    # which /props reports as 4294967295); else 0..4294967294.
    seed: int = -1
    n_predict: int = -1  # -n/--predict/--n-predict (LLAMA_ARG_N_PREDICT); -1 = no limit
    n_probs: int = 0  # no flag in llama-server: per request only
    ignore_eos: bool = False  # --ignore-eos
    # -l/--logit-bias TOKEN_ID(+/-)BIAS (repeatable): (token id, bias) in flag order.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # --samplers a;b;c (names and aliases) or --sampler-seq/--sampling-seq chars, as canonical
    # llama-server names (common_sampler_type_to_str).
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP front end (the server's slice)."""

    host: str = "127.0.0.1"  # --host (LLAMA_ARG_HOST): the first address of `hosts`
    # --host, comma-separated addresses or UNIX socket paths ending in .sock.
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 8080  # --port (LLAMA_ARG_PORT), 0..65535 (0: any free port)
    # --api-key (LLAMA_API_KEY, comma-separated) then --api-key-file (LLAMA_ARG_API_KEY_FILE,
    # one key per line, '#' comments), accumulated as llama-server; empty: no auth.
    api_keys: tuple[str, ...] = ()
    timeout_s: int = 3600  # -to/--timeout (LLAMA_ARG_TIMEOUT): read/write timeout
    # --threads-http (LLAMA_ARG_THREADS_HTTP); -1: llama-server's max(n_parallel + 4, cpus - 1).
    n_threads_http: int = -1
    metrics: bool = False  # --metrics (LLAMA_ARG_ENDPOINT_METRICS): serve /metrics
    slots_endpoint: bool = True  # --slots/--no-slots (LLAMA_ARG_ENDPOINT_SLOTS)
    props_write: bool = False  # --props (LLAMA_ARG_ENDPOINT_PROPS): allow POST /props
    # --slot-save-path (no env var): an existing directory, as given; None: save/restore off.
    slot_save_path: str | None = None
    api_prefix: str = ""  # --api-prefix (LLAMA_ARG_API_PREFIX), no trailing slash
    # --ui/--webui, --no-ui/--no-webui (LLAMA_ARG_UI): serve the web page at / (kvswap.web).
    webui: bool = True
    # --path (LLAMA_ARG_STATIC_PATH): serve this folder's files at / instead of the page; None
    # (or an empty value): the page. With the UI on it must be a directory (checked at parse).
    static_path: str | None = None
    # --ssl-key-file / --ssl-cert-file (LLAMA_ARG_SSL_KEY_FILE / _CERT_FILE): PEM files; both
    # given: the server speaks HTTPS (one alone is refused at start).
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    # kvswap-only --max-body-bytes (KVSWAP_ARG_MAX_BODY_BYTES): request bodies past this: 413.
    max_body_bytes: int = 32 << 20
    # kvswap-only --max-n-predict (KVSWAP_ARG_MAX_N_PREDICT): caps every request's n_predict;
    # -1 = no cap beyond the slot's window.
    max_n_predict: int = -1
    # --cors-origins (LLAMA_ARG_CORS_ORIGINS): '*', 'localhost' (reflect localhost origins
    # only) or a value sent verbatim; 'localhost' when tools or MCP servers are asked for and
    # this is not given, as llama-server.
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"  # --cors-methods (LLAMA_ARG_CORS_METHODS)
    cors_headers: str = "*"  # --cors-headers (LLAMA_ARG_CORS_HEADERS)
    # --cors-credentials/--no-cors-credentials (LLAMA_ARG_CORS_CREDENTIALS).
    cors_credentials: bool = True
    # --ui-mcp-proxy (LLAMA_ARG_UI_MCP_PROXY) or --agent: serve /cors-proxy.
    ui_mcp_proxy: bool = False
    # kvswap-only --ui-mcp-proxy-allow (KVSWAP_ARG_UI_MCP_PROXY_ALLOW): networks (CIDR, as
    # normalised by `ipaddress`) /cors-proxy may reach although not globally routable
    # (loopback, link-local, private); () = public addresses only.
    ui_mcp_proxy_allow: tuple[str, ...] = ()
    # kvswap-only --ui-mcp-proxy-max-bytes (KVSWAP_ARG_UI_MCP_PROXY_MAX_BYTES): the largest
    # body /cors-proxy sends to its target or relays back.
    ui_mcp_proxy_max_bytes: int = 32 << 20
    # --tools (LLAMA_ARG_TOOLS) or --agent: llama-server's built-in tools, which kvswap does
    # not run; recorded for the CORS default.
    server_tools: tuple[str, ...] = ()
    # --mcp-servers-config/--mcp-servers-json given (not run by kvswap; the CORS default).
    mcp_servers: bool = False
    # kvswap-only --session-minds/--no-session-minds (KVSWAP_ARG_SESSION_MINDS): a request's
    # session key (the body's prompt_cache_key, a session header) names its mind when it names
    # none itself (kvswap.minds.names).
    session_minds: bool = True
    # kvswap-only --session-header (KVSWAP_ARG_SESSION_HEADER, comma-separated, added after
    # these): the headers whose value is a session key, lower case, in precedence order.
    session_headers: tuple[str, ...] = ("x-conversation-id", "x-claude-code-session-id")


@dataclass(frozen=True)
class PagingSettings:
    """The page store and the idle policies (the pages' slice)."""

    # kvswap-only --page-ram-bytes (KVSWAP_ARG_PAGE_RAM_BYTES): the store's ceiling; default
    # min(25% of physical RAM, 8 GiB), computed when parsing; 0 disables the store.
    page_ram_bytes: int = field(default_factory=_probed_page_ram_bytes)
    # kvswap-only --page-disk-bytes (KVSWAP_ARG_PAGE_DISK_BYTES): bound on spilled bytes under
    # --slot-save-path; None = no bound.
    page_disk_bytes: int | None = None
    # kvswap-only --page-disk-drop-lru (KVSWAP_ARG_PAGE_DISK_DROP_LRU): a full disk tier drops
    # the least recently used spilled minds instead of refusing new spills.
    page_disk_drop_lru: bool = False
    # kvswap-only --page-flush-seconds (KVSWAP_ARG_PAGE_FLUSH_SECONDS): with --slot-save-path, a
    # mind changed this long ago is written to disk at its next idle moment, so a SIGKILL loses
    # at most about this many seconds of its turns; 0 = only under RAM pressure and at exit.
    page_flush_seconds: float = 30.0
    # -cram/--cache-ram (LLAMA_ARG_CACHE_RAM): llama-server's prompt cache in MiB;
    # -1 = no limit, 0 = off.
    cache_ram_mib: int = 8192
    # --cache-idle-slots/--no-cache-idle-slots (LLAMA_ARG_CACHE_IDLE_SLOTS): a task starting
    # saves every other idle slot to the prompt cache (and, with unified KV, clears it).
    cache_idle_slots: bool = True
    # -sps/--slot-prompt-similarity (no env var): least prefix share to reuse a slot; 0 = off.
    slot_prompt_similarity: float = 0.1
    # --sleep-idle-seconds (no env var): sleep after N idle seconds; -1 = never (0 refused).
    sleep_idle_seconds: int = -1


@dataclass(frozen=True)
class SpecSettings:
    """Speculative decoding (the drafter's slice)."""

    # --spec-type (LLAMA_ARG_SPEC_TYPE): 'none' | 'draft-simple' | 'ngram-simple'. As the
    # pinned llama-server, -md alone does not enable drafting.
    spec_type: str = "none"
    # --spec-draft-model/-md/--model-draft (LLAMA_ARG_SPEC_DRAFT_MODEL).
    model_draft: str | None = None
    n_max: int = 3  # --spec-draft-n-max (LLAMA_ARG_SPEC_DRAFT_N_MAX), >= 0
    n_min: int = 0  # --spec-draft-n-min (LLAMA_ARG_SPEC_DRAFT_N_MIN)
    p_min: float = 0.0  # --spec-draft-p-min/--draft-p-min (LLAMA_ARG_SPEC_DRAFT_P_MIN)
    # --spec-draft-type-k/-ctkd/--cache-type-k-draft (LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K), and V.
    cache_type_k_draft: str = "f16"
    cache_type_v_draft: str = "f16"
    # --spec-draft-ngl/-ngld/... (LLAMA_ARG_N_GPU_LAYERS_DRAFT): as n_gpu_layers (-1 auto).
    n_gpu_layers_draft: int = N_GPU_LAYERS_AUTO
    # --spec-draft-threads/-td/--threads-draft: default n_threads; <= 0: all logical CPUs.
    n_threads_draft: int = field(default_factory=_probed_cpu_physical)
    # --spec-draft-threads-batch/-tbd/--threads-batch-draft: default n_threads_batch (as
    # llama-server's code, though its help says --threads-draft).
    n_threads_batch_draft: int = field(default_factory=_probed_cpu_physical)
    # ngram-simple: --spec-ngram-simple-size-n (lookup n-gram), -size-m (drafted m-gram),
    # -min-hits, each 1..1024.
    ngram_size_n: int = 12
    ngram_size_m: int = 48
    ngram_min_hits: int = 1
    # The draft context has no -cd in the pinned tree: it takes the target's n_ctx.


@dataclass(frozen=True)
class ClusterSettings:
    """The shared Redis tier and this replica's name in a cluster (kvswap-only; the shared
    tier's slice). `shared_tier` None: no cluster, every other field unused."""

    # --shared-tier (KVSWAP_ARG_SHARED_TIER): redis://[user:password@]host:port/db.
    shared_tier: str | None = None
    # --replica-id (KVSWAP_ARG_REPLICA_ID): this replica's name (its HAProxy server name).
    replica_id: str | None = None
    # --advertise-url (KVSWAP_ARG_ADVERTISE_URL): where the other replicas reach this one.
    advertise_url: str | None = None
    # --shared-tier-bytes (KVSWAP_ARG_SHARED_TIER_BYTES): the tier's byte budget (least
    # recently used minds degrade to tokens only past it); None: no budget.
    shared_tier_bytes: int | None = None
    # --shared-tier-rpo-tokens (KVSWAP_ARG_SHARED_TIER_RPO_TOKENS): a turn that leaves more
    # unpublished tokens than this publishes the page before answering; 0: every turn.
    rpo_tokens: int = 2048
    # --shared-tier-rpo-seconds (KVSWAP_ARG_SHARED_TIER_RPO_SECONDS): a dirty page is
    # published in the background once it is this old.
    rpo_seconds: float = 30.0
    # --shared-tier-lease-ms (KVSWAP_ARG_SHARED_TIER_LEASE_MS): a mind's owner lease; a dead
    # owner's minds move after at most this long.
    lease_ms: int = 5000
    # --shared-tier-peers (KVSWAP_ARG_SHARED_TIER_PEERS): every replica's advertised URL, the
    # only places a turn is forwarded to.
    peers: tuple[str, ...] = ()
    # --shared-tier-quiet-seconds (KVSWAP_ARG_SHARED_TIER_QUIET_SECONDS): a mind idle this
    # long after its turn is published (a SIGKILL then loses only minds that were mid-turn).
    quiet_seconds: float = 2.0
    # --shared-tier-release-seconds (KVSWAP_ARG_SHARED_TIER_RELEASE_SECONDS): a published
    # mind idle this long has its lease released (its copies here stay).
    release_seconds: float = 60.0
    # --shared-tier-drain-seconds (KVSWAP_ARG_SHARED_TIER_DRAIN_SECONDS): the most SIGTERM
    # spends publishing to the tier (after the spill to disk).
    drain_seconds: float = 60.0


@dataclass(frozen=True)
class StateSettings:
    """The stored conversations of the Responses API (kvswap-only; the minds layer's slice)."""

    # --state-dir (KVSWAP_ARG_STATE_DIR): the folder of their database; None: under
    # --slot-save-path (`.kvswap-state/`), or in memory without one.
    state_dir: str | None = None
    # --state-ttl-seconds (KVSWAP_ARG_STATE_TTL_SECONDS): how long a stored response is kept
    # (30 days, as OpenAI); conversations have no time to live.
    ttl_s: float = 30 * 86400.0
    # --state-bytes (KVSWAP_ARG_STATE_BYTES): the records' byte budget; past it the least
    # recently used chains are dropped first, with their minds. None: no bound.
    budget_bytes: int | None = 1 << 30
    # --state-background-per-key (KVSWAP_ARG_STATE_BACKGROUND_PER_KEY): background responses
    # one API key may have queued or running at once; past it a 429.
    background_per_key: int = 8


@dataclass(frozen=True)
class LogSettings:
    """Logging (the process's slice)."""

    verbose: bool = False  # -v/--verbose/--log-verbose given
    # -lv/--verbosity/--log-verbosity (LLAMA_ARG_LOG_VERBOSITY): 0 generic, 1 error, 2 warning,
    # 3 info, 4 trace, 5 debug; -v sets it to VERBOSITY_ALL (the later flag wins).
    verbosity: int = 3
    log_disable: bool = False  # --log-disable
    log_file: str | None = None  # --log-file (LLAMA_ARG_LOG_FILE)


@dataclass(frozen=True)
class ServerConfig:
    """Everything `kvswap serve` was started with."""

    model: ModelSettings = field(default_factory=ModelSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    http: HttpSettings = field(default_factory=HttpSettings)
    paging: PagingSettings = field(default_factory=PagingSettings)
    spec: SpecSettings = field(default_factory=SpecSettings)
    log: LogSettings = field(default_factory=LogSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    state: StateSettings = field(default_factory=StateSettings)
    # llama-server flags accepted but not implemented by kvswap, as spelled on the command line
    # (or the environment variable's name), in order, once each; the server logs them.
    ignored_flags: tuple[str, ...] = ()
