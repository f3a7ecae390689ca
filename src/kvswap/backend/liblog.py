"""Routes libllama's log output into Python `logging`.

Importing `llama_cpp` installs a Python callback that prints every libllama line to stderr.
`route_libllama_logs` replaces it, once per process, with one that forwards whole lines to the
`kvswap.libllama` logger. Lines below the chosen level are dropped before any formatting, so the
callback costs almost nothing on the rare occasions libllama logs during decoding.

Owns: the one C callback object (kept alive for the process). Does not configure handlers.
"""

from __future__ import annotations

import ctypes
import logging
import threading

from kvswap.backend.bindings import llama_cpp

_LOGGER = logging.getLogger("kvswap.libllama")

# ggml_log_level (ggml.h: NONE, DEBUG, INFO, WARN, ERROR) -> logging level; CONT (5) continues
# the previous line's level.
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_LEVEL_CONT = 5


class _LogRouter:
    """Joins libllama's partial lines and forwards complete ones to `logging`."""

    def __init__(self, min_level: int) -> None:
        self.min_level = min_level
        self._lock = threading.Lock()
        self._pending = ""
        self._pending_level = logging.INFO
        self.callback = llama_cpp.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        py_level = self._pending_level if level == _LEVEL_CONT else _LEVELS.get(level, logging.INFO)
        if py_level < self.min_level:
            return
        chunk = text.decode("utf-8", "replace")
        with self._lock:
            self._pending_level = py_level
            self._pending += chunk
            if not self._pending.endswith("\n"):
                return
            lines, self._pending = self._pending.rstrip("\n"), ""
        for line in lines.split("\n"):
            if line:
                _LOGGER.log(py_level, "%s", line)


_ROUTER: list[_LogRouter] = []


def route_libllama_logs(min_level: int = logging.WARNING) -> None:
    """Send libllama's logs to the `kvswap.libllama` logger, dropping those below `min_level`."""
    if _ROUTER:
        _ROUTER[0].min_level = min_level
        return
    router = _LogRouter(min_level)
    _ROUTER.append(router)
    llama_cpp.llama_log_set(router.callback, ctypes.c_void_p(0))
