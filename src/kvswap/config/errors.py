"""The exceptions `kvswap serve`'s command line raises.

Owns: `ConfigError` (a bad flag, value or environment variable; the message names it) and
`HelpRequested` (the caller prints `format_help()` or the version and exits). Raised by the
parsing modules of this package only.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A flag, value or environment variable that kvswap refuses; the message names it."""


class HelpRequested(Exception):
    """`-h/--help/--usage` or `--version` was given; `flag` says which, as spelled."""

    def __init__(self, flag: str) -> None:
        super().__init__(flag)
        self.flag = flag
