"""llama-cpp-python's ctypes bindings (`llama_cpp.llama_cpp`), loaded without its high-level API.

`import llama_cpp` runs the package's `__init__`, which also imports `Llama`, the chat formats
(jinja2 and more) and a log callback that prints every libllama line: about three quarters of the
package's import time (measured 1.22 s against 0.33 s on a busy 2-core machine), none of it used
by kvswap. A cold start pays that before the first request. So this module registers the package
without running its `__init__`, imports only the bindings, and copies their public names onto
the package, as its `from .llama_cpp import *` would: `llama_cpp.llama_decode` is then the same
function whoever imports it. A process that imported the real package first keeps it.

Every module of `kvswap.backend` takes `llama_cpp` from here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING


def _load() -> ModuleType:
    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None:
            raise ImportError("llama-cpp-python is not installed")
        package = importlib.util.module_from_spec(spec)
        sys.modules["llama_cpp"] = package
        try:
            low = importlib.import_module("llama_cpp.llama_cpp")
        except BaseException:
            del sys.modules["llama_cpp"]
            raise
        package.__dict__.update({k: v for k, v in vars(low).items() if not k.startswith("_")})
    return importlib.import_module("llama_cpp.llama_cpp")


if TYPE_CHECKING:
    from llama_cpp import llama_cpp
else:
    llama_cpp = _load()

__all__ = ["llama_cpp"]
