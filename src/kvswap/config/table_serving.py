"""Flag table: llama-server's server-specific flags kvswap implements, and kvswap's own flags.

Owns the entries and setters for the HTTP front end (the web page included), slots,
checkpoints, the prompt cache, the page store and the request limits. kvswap-only flags take
`KVSWAP_ARG_*` environment variables. `--api-key-file`, `--chat-template-file` and
`--slot-save-path` look at the file system (`--path` is checked once parsing is done).
"""

from __future__ import annotations

import json
import os

from kvswap.config.argspec import (
    Builder,
    Flag,
    Group,
    Kind,
    Setter,
    flag,
    set_bool,
    set_float,
    set_int,
    set_size,
)
from kvswap.config.sizes import parse_size
from kvswap.config.values import read_float, read_int, read_on_off_auto, split_csv

VALUE, VOID, TOGGLE = Kind.VALUE, Kind.VOID, Kind.TOGGLE
SERVER, MINDS = Group.SERVER, Group.MINDS
PAGES, LIMITS = Group.PAGES, Group.LIMITS


def _comma_words(v: str) -> set[str]:
    return {word.strip() for word in v.split(",") if word.strip()}


def _add_aliases(b: Builder, v: str) -> None:
    b.update("model", aliases=tuple(sorted(set(b.model.aliases) | _comma_words(v))))


def _add_tags(b: Builder, v: str) -> None:
    b.update("model", tags=tuple(sorted(set(b.model.tags) | _comma_words(v))))


def _set_hosts(b: Builder, v: str) -> None:
    hosts = tuple(host.strip() for host in split_csv(v) if host.strip())
    if not hosts:
        raise ValueError("--host requires at least one address")
    b.update("http", hosts=hosts, host=hosts[0])


def _add_api_keys(b: Builder, v: str) -> None:
    keys = tuple(key for key in split_csv(v) if key)
    b.update("http", api_keys=b.http.api_keys + keys)


def _add_session_headers(b: Builder, v: str) -> None:
    names = tuple(name.strip().lower() for name in split_csv(v) if name.strip())
    if not names:
        raise ValueError("--session-header requires at least one header name")
    added = tuple(n for n in names if n not in b.http.session_headers)
    b.update("http", session_headers=b.http.session_headers + added)


def _add_api_key_file(b: Builder, v: str) -> None:
    try:
        with open(v, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"failed to open file '{v}': {e.strerror}") from None
    keys = tuple(line for line in lines if line and not line.startswith("#"))
    b.update("http", api_keys=b.http.api_keys + keys)


def _set_slot_save_path(b: Builder, v: str) -> None:
    if not os.path.isdir(v):
        raise ValueError(f"not a directory: {v}")
    b.update("http", slot_save_path=v)


def _set_chat_template(b: Builder, v: str) -> None:
    b.update("model", chat_template=v, chat_template_file=None)


def _set_chat_template_file(b: Builder, v: str) -> None:
    if not os.path.isfile(v):
        raise ValueError(f"failed to open file '{v}'")
    b.update("model", chat_template_file=v, chat_template=None)


def _set_reasoning(b: Builder, v: str) -> None:
    b.update("model", reasoning=read_on_off_auto(v))


def _set_chat_template_kwargs(b: Builder, v: str) -> None:
    try:
        parsed = json.loads(v)
    except ValueError as err:
        raise ValueError(f"not valid JSON: {err}") from err
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    pairs = dict(b.model.chat_template_kwargs)
    pairs.update({key: json.dumps(value) for key, value in parsed.items()})
    b.update("model", chat_template_kwargs=tuple(pairs.items()))


def _set_page_flush_seconds(b: Builder, v: str) -> None:
    seconds = read_float(v)
    if not 0 <= seconds <= 86400:
        raise ValueError("must be between 0 (off) and 86400 seconds")
    b.update("paging", page_flush_seconds=seconds)


def _set_pem_file(name: str) -> Setter:
    def apply(b: Builder, v: str) -> None:
        if not os.path.isfile(v):
            raise ValueError(f"failed to open file '{v}'")
        b.update("http", **{name: v})

    return apply


def _set_checkpoint_min_step(b: Builder, v: str) -> None:
    step = read_int(v)
    if step < 0:
        raise ValueError("checkpoint-min-step must be non-negative")
    b.update("context", checkpoint_min_step=step)


def _set_sleep_idle(b: Builder, v: str) -> None:
    seconds = read_int(v)
    if seconds == 0 or seconds < -1:
        raise ValueError("invalid value: cannot be 0 or less than -1")
    b.update("paging", sleep_idle_seconds=seconds)


def _set_max_body_bytes(b: Builder, v: str) -> None:
    n_bytes = parse_size(v, "--max-body-bytes")
    if n_bytes < 1:
        raise ValueError("must be at least 1 byte")
    b.update("http", max_body_bytes=n_bytes)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--kv-unified-per-slot", VALUE, MINDS,
         set_int("context", "kv_unified_per_slot", lo=0), env="LLAMA_ARG_KV_UNIFIED_PER_SLOT",
         hint="N", help="context limit per parallel slot, the most one mind may hold (default: "
         "0 = unset); without -c/--ctx-size the shared KV pool is sized to n_parallel*N"),
    flag("-kvu --kv-unified", TOGGLE, MINDS, set_bool("context", "kv_unified"),
         neg="-no-kvu --no-kv-unified", env="LLAMA_ARG_KV_UNIFIED",
         help="single unified KV buffer shared across all sequences, so one mind may grow to "
         "the whole -c (default: enabled if the number of slots is auto; an explicit -np N "
         "without -kvu splits -c into N fixed windows)"),
    flag("-ctxcp --ctx-checkpoints --swa-checkpoints", VALUE, SERVER,
         set_int("context", "ctx_checkpoints", lo=0), env="LLAMA_ARG_CTX_CHECKPOINTS",
         hint="N", help="max number of context checkpoints per slot (default: 32)"),
    flag("-cms --checkpoint-min-step", VALUE, SERVER, _set_checkpoint_min_step,
         env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT", hint="N",
         help="minimum spacing between context checkpoints in tokens (default: 8192, "
         "0 = no minimum)"),
    flag("-cram --cache-ram", VALUE, MINDS, set_int("paging", "cache_ram_mib", lo=-1),
         env="LLAMA_ARG_CACHE_RAM", hint="N",
         help="maximum prompt cache size in MiB (default: 8192, -1 - no limit, 0 - disable): "
         "the anonymous cache of requests that name no mind; it never takes a mind's page"),
    flag("--cache-idle-slots", TOGGLE, SERVER, set_bool("paging", "cache_idle_slots"),
         neg="--no-cache-idle-slots", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
         help="save idle slots to the prompt cache (clearing them with unified KV) when a "
         "task starts (default: enabled; needs --cache-ram)"),
    flag("--cache-prompt", TOGGLE, SERVER, set_bool("context", "cache_prompt"),
         neg="--no-cache-prompt", env="LLAMA_ARG_CACHE_PROMPT",
         help="prompt caching (default: enabled)"),
    flag("-a --alias", VALUE, SERVER, _add_aliases, env="LLAMA_ARG_ALIAS", hint="STRING",
         help="model name aliases, comma-separated (to be used by API)"),
    flag("--tags", VALUE, SERVER, _add_tags, env="LLAMA_ARG_TAGS", hint="STRING",
         help="model tags, comma-separated (informational)"),
    flag("--host", VALUE, SERVER, _set_hosts, env="LLAMA_ARG_HOST", hint="HOST",
         help="IP addresses to listen on, comma-separated, or UNIX socket paths ending in "
         ".sock (default: 127.0.0.1)"),
    flag("--port", VALUE, SERVER, set_int("http", "port", lo=0, hi=65535),
         env="LLAMA_ARG_PORT", hint="PORT", help="port to listen (default: 8080)"),
    flag("--api-prefix", VALUE, SERVER, lambda b, v: b.update("http", api_prefix=v),
         env="LLAMA_ARG_API_PREFIX", hint="PREFIX",
         help="prefix path the server serves from, without the trailing slash (default: '')"),
    flag("--path", VALUE, SERVER, lambda b, v: b.update("http", static_path=v or None),
         env="LLAMA_ARG_STATIC_PATH", hint="PATH",
         help="path to serve static files from, instead of kvswap's page (default: none)"),
    flag("--ui --webui", TOGGLE, MINDS, set_bool("http", "webui"), neg="--no-ui --no-webui",
         env="LLAMA_ARG_UI", help="whether to enable the Web UI (default: enabled): kvswap's "
         "page at / to chat with minds and see where each one lives"),
    flag("--api-key", VALUE, MINDS, _add_api_keys, env="LLAMA_API_KEY", hint="KEY",
         help="API key for authentication, several as a comma-separated list (default: none); "
         "each key is a tenant with minds and pages of its own"),
    flag("--api-key-file", VALUE, SERVER, _add_api_key_file, env="LLAMA_ARG_API_KEY_FILE",
         hint="FNAME", help="file of API keys, one per line, '#' starts a comment line"),
    flag("-to --timeout", VALUE, SERVER, set_int("http", "timeout_s", lo=0),
         env="LLAMA_ARG_TIMEOUT", hint="N",
         help="server read/write timeout in seconds (default: 3600)"),
    flag("--threads-http", VALUE, SERVER, set_int("http", "n_threads_http"),
         env="LLAMA_ARG_THREADS_HTTP", hint="N",
         help="threads used to process HTTP requests (default: -1)"),
    flag("--metrics", VOID, SERVER, set_bool("http", "metrics"),
         env="LLAMA_ARG_ENDPOINT_METRICS",
         help="enable prometheus compatible metrics endpoint (default: disabled)"),
    flag("--props", VOID, SERVER, set_bool("http", "props_write"),
         env="LLAMA_ARG_ENDPOINT_PROPS",
         help="enable changing global properties via POST /props (default: disabled)"),
    flag("--slots", TOGGLE, SERVER, set_bool("http", "slots_endpoint"), neg="--no-slots",
         env="LLAMA_ARG_ENDPOINT_SLOTS",
         help="expose slots monitoring endpoint (default: enabled)"),
    flag("--slot-save-path", VALUE, MINDS, _set_slot_save_path, hint="PATH",
         help="path to save slot kv cache (default: disabled), and kvswap's disk tier: minds "
         "spill there under RAM pressure, are flushed there (--page-flush-seconds) and at exit, "
         "and a restart serves them again; without it, minds are lost at exit"),
    flag("--chat-template", VALUE, SERVER, _set_chat_template, env="LLAMA_ARG_CHAT_TEMPLATE",
         hint="JINJA_TEMPLATE",
         help="set custom jinja chat template (default: template taken from model's metadata)"),
    flag("--chat-template-file", VALUE, SERVER, _set_chat_template_file,
         env="LLAMA_ARG_CHAT_TEMPLATE_FILE", hint="JINJA_TEMPLATE_FILE",
         help="set custom jinja chat template file (default: template from model's metadata)"),
    flag("--jinja", TOGGLE, SERVER, set_bool("model", "use_jinja"), neg="--no-jinja",
         env="LLAMA_ARG_JINJA",
         help="whether to use jinja template engine for chat (default: enabled); without it, "
         "libllama's built-in chat formats render the template"),
    flag("--prefill-assistant", TOGGLE, SERVER, set_bool("model", "prefill_assistant"),
         neg="--no-prefill-assistant", env="LLAMA_ARG_PREFILL_ASSISTANT",
         help="whether to prefill the assistant's response if the last message is an "
         "assistant message (default: prefill enabled)"),
    flag("-rea --reasoning", VALUE, SERVER, _set_reasoning, env="LLAMA_ARG_REASONING",
         hint="[on|off|auto]",
         help="use reasoning/thinking in the chat ('on', 'off', or 'auto', default: 'auto' "
         "(detect from template))"),
    flag("--chat-template-kwargs", VALUE, SERVER, _set_chat_template_kwargs,
         env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", hint="STRING",
         help="sets additional params for the json template parser, must be a valid json object "
         "string, e.g. '{\"key1\":\"value1\",\"key2\":\"value2\"}' (a request's own "
         "chat_template_kwargs win)"),
    flag("--ssl-key-file", VALUE, SERVER, _set_pem_file("ssl_key_file"),
         env="LLAMA_ARG_SSL_KEY_FILE", hint="FNAME",
         help="path to file a PEM-encoded SSL private key"),
    flag("--ssl-cert-file", VALUE, SERVER, _set_pem_file("ssl_cert_file"),
         env="LLAMA_ARG_SSL_CERT_FILE", hint="FNAME",
         help="path to file a PEM-encoded SSL certificate"),
    flag("-sps --slot-prompt-similarity", VALUE, SERVER,
         set_float("paging", "slot_prompt_similarity"), hint="SIMILARITY",
         help="how much the prompt of a request must match the prompt of a slot to use that "
         "slot (default: 0.10, 0.0 = disabled)"),
    flag("--lora-init-without-apply", VOID, SERVER, set_bool("model", "lora_init_without_apply"),
         help="load LoRA adapters without applying them (apply later via POST /lora-adapters)"),
    flag("--sleep-idle-seconds", VALUE, MINDS, _set_sleep_idle, hint="SECONDS",
         help="seconds of idleness after which the server sleeps (default: -1 = disabled); "
         "it spills every mind first and wakes with all of them"),
    flag("--ctx-checkpoints-bytes", VALUE, PAGES,
         set_size("context", "ctx_checkpoints_bytes", "--ctx-checkpoints-bytes"),
         env="KVSWAP_ARG_CTX_CHECKPOINTS_BYTES", hint="SIZE",
         help="one byte budget over all slots' context checkpoints, which let a mind of a "
         "recurrent, hybrid or sliding-window model that diverges mid-way resume near the "
         "divergence instead of from zero (default: 0 = off)"),
    flag("--page-ram-bytes", VALUE, PAGES,
         set_size("paging", "page_ram_bytes", "--page-ram-bytes"),
         env="KVSWAP_ARG_PAGE_RAM_BYTES", hint="SIZE",
         help="ceiling of the RAM page store, where minds out of their slots wait (default: "
         "min(25% of RAM, 8G); 0 = no store); to keep room under it, the least recently used "
         "are spilled to --slot-save-path"),
    flag("--page-disk-bytes", VALUE, PAGES,
         set_size("paging", "page_disk_bytes", "--page-disk-bytes"),
         env="KVSWAP_ARG_PAGE_DISK_BYTES", hint="SIZE",
         help="bound on the bytes of minds and pages spilled to --slot-save-path (default: no "
         "bound)"),
    flag("--page-disk-drop-lru", VOID, PAGES, set_bool("paging", "page_disk_drop_lru"),
         env="KVSWAP_ARG_PAGE_DISK_DROP_LRU",
         help="when --page-disk-bytes is full, drop the least recently used spilled minds "
         "(logged and counted) instead of refusing new spills"),
    flag("--page-flush-seconds", VALUE, PAGES, _set_page_flush_seconds,
         env="KVSWAP_ARG_PAGE_FLUSH_SECONDS", hint="SECONDS",
         help="with --slot-save-path, write each mind changed this many seconds ago to disk "
         "when it is idle, so a SIGKILL loses at most that window (default: 30; 0 = only under "
         "RAM pressure and at exit)"),
    flag("--session-minds", TOGGLE, PAGES, set_bool("http", "session_minds"),
         neg="--no-session-minds", env="KVSWAP_ARG_SESSION_MINDS",
         help="a request that names no mind gets one from its session key: the body's "
         "prompt_cache_key, else the X-Conversation-Id or x-claude-code-session-id header "
         "(default: enabled)"),
    flag("--session-header", VALUE, PAGES, _add_session_headers,
         env="KVSWAP_ARG_SESSION_HEADER", hint="NAME[,NAME]",
         help="more headers whose value is a session key, after the two above (default: none)"),
    flag("--max-body-bytes", VALUE, LIMITS, _set_max_body_bytes,
         env="KVSWAP_ARG_MAX_BODY_BYTES", hint="SIZE",
         help="largest request body accepted (default: 32M)"),
    flag("--max-n-predict", VALUE, LIMITS, set_int("http", "max_n_predict", lo=-1),
         env="KVSWAP_ARG_MAX_N_PREDICT", hint="N",
         help="cap on every request's n_predict (default: -1 = only the slot's window)"),
)
# fmt: on
