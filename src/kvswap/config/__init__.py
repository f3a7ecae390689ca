"""kvswap's configuration: `kvswap serve`'s command line and the frozen settings it yields.

Public API: `parse_serve_args(argv, environ)` -> `ServerConfig`, `format_help()`,
`parse_size(text, flag)`, the settings dataclasses, `ConfigError` and `HelpRequested`.
Nothing here touches libllama; importing the package has no side effects.
"""

from kvswap.config.errors import ConfigError, HelpRequested
from kvswap.config.flags import format_help, parse_serve_args
from kvswap.config.machine import MachineInfo
from kvswap.config.settings import (
    ContextSettings,
    HttpSettings,
    LogSettings,
    LoraSpec,
    ModelSettings,
    PagingSettings,
    SamplingDefaults,
    ServerConfig,
    SpecSettings,
)
from kvswap.config.sizes import format_size, parse_size

__all__ = [
    "ConfigError",
    "ContextSettings",
    "HelpRequested",
    "HttpSettings",
    "LogSettings",
    "LoraSpec",
    "MachineInfo",
    "ModelSettings",
    "PagingSettings",
    "SamplingDefaults",
    "ServerConfig",
    "SpecSettings",
    "format_help",
    "format_size",
    "parse_serve_args",
    "parse_size",
]
