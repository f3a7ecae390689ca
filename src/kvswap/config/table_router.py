"""Flag table: llama-server's router mode, which kvswap refuses with one clear line.

Owns `--models-dir`, `--models-preset`, `--models-max` and `--models-autoload` (and their
environment variables). In llama-server they run a router that starts one child server per
model; kvswap serves one model per process (`-m`), so each of these flags fails at start-up
naming itself and what to do instead, rather than being accepted and silently ignored.
"""

from __future__ import annotations

from kvswap.config.argspec import Builder, Flag, Group, Kind, flag

ROUTER_REFUSAL = (
    "llama-server's router mode (several models behind one server) is not supported by "
    "kvswap: start one kvswap serve -m MODEL per model"
)


def _refuse(_: Builder, __: str) -> None:
    raise ValueError(ROUTER_REFUSAL)


# fmt: off
FLAGS: tuple[Flag, ...] = (
    flag("--models-dir", Kind.VALUE, Group.SERVER, _refuse, env="LLAMA_ARG_MODELS_DIR",
         hint="PATH", help="llama-server's router mode: refused (kvswap serves one model)"),
    flag("--models-preset", Kind.VALUE, Group.SERVER, _refuse, env="LLAMA_ARG_MODELS_PRESET",
         hint="PATH", help="llama-server's router mode: refused (kvswap serves one model)"),
    flag("--models-max", Kind.VALUE, Group.SERVER, _refuse, env="LLAMA_ARG_MODELS_MAX",
         hint="N", help="llama-server's router mode: refused (kvswap serves one model)"),
    flag("--models-autoload", Kind.TOGGLE, Group.SERVER, _refuse, neg="--no-models-autoload",
         env="LLAMA_ARG_MODELS_AUTOLOAD",
         help="llama-server's router mode: refused (kvswap serves one model)"),
)
# fmt: on
