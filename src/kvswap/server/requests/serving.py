"""What preparing a body reads of the running server: `Serving`, a narrow view of it.

The configuration, the chat template, the vocabulary (read-only calls, safe off the engine
thread), the engine's last snapshot (slots, context size) and the LoRA scales. `state.
ServerState` is one; this folder never imports the shell's state, so the state can hold what
this folder defines (`lora.LoraScales`).
"""

from __future__ import annotations

from typing import Protocol

from kvswap.backend.vocab import TokenArray, Vocab
from kvswap.config.settings import ServerConfig
from kvswap.engine.snapshot import EngineSnapshot
from kvswap.server.requests.lora import LoraScales
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import ChatTemplate


class Serving(Protocol):
    """See the module docstring."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def template(self) -> ChatTemplate | BuiltinTemplate: ...

    @property
    def vocab(self) -> Vocab: ...

    @property
    def snapshot(self) -> EngineSnapshot: ...

    @property
    def lora(self) -> LoraScales: ...

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> TokenArray: ...
