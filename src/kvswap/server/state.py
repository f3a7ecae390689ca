"""What HTTP handlers share: the engine client, the vocabulary, the chat template, the config.

Built once by `build_state` at start-up; routes read it from `app.state.kvswap`. The engine
thread owns every libllama context; handlers only tokenize and render templates here (read-only
vocabulary calls) and post commands through `client`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request

from kvswap.backend.chat_builtin import apply_builtin, builtin_template_names
from kvswap.backend.model import Model
from kvswap.backend.vocab import TokenArray, Vocab
from kvswap.config.settings import ServerConfig
from kvswap.engine.client import EngineClient
from kvswap.engine.engine import Engine
from kvswap.engine.types import ErrorKind, KvswapError
from kvswap.files import Publisher
from kvswap.server.lora import LoraScales
from kvswap.server.minds import MindGate
from kvswap.server.prometheus import MetricsRenderer
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import CHATML_TEMPLATE, ChatTemplate

log = logging.getLogger("kvswap.server")


@dataclass
class ServerState:
    """Shared, read-mostly state of the HTTP front end."""

    config: ServerConfig
    model: Model
    engine: Engine
    template: ChatTemplate | BuiltinTemplate
    model_name: str
    save_dir: Path | None
    io: ThreadPoolExecutor  # file I/O off the engine thread and off the event loop
    publisher: Publisher | None  # slot files under --slot-save-path; None: save/restore off
    lora: LoraScales  # the loaded LoRA adapters and their global scales
    metrics: MetricsRenderer = field(default_factory=MetricsRenderer)
    client: EngineClient | None = None  # set when the event loop starts
    minds: MindGate | None = None  # named minds (needs the page store)
    t_start: float = field(default_factory=time.time)

    @property
    def vocab(self) -> Vocab:
        return self.model.vocab

    def engine_client(self) -> EngineClient:
        assert self.client is not None, "the event loop has not started"
        return self.client

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> TokenArray:
        return self.vocab.tokenize(text, add_special, parse_special)


def get_state(request: Request) -> ServerState:
    """The server state of a request's app (the guard has already answered 503 while loading)."""
    state: ServerState | None = request.app.state.loader.state
    if state is None:
        raise KvswapError(ErrorKind.UNAVAILABLE, "Loading model")
    return state


def load_chat_template(config: ServerConfig, model: Model) -> ChatTemplate | BuiltinTemplate:
    """The template llama-server would use: --chat-template(-file), the GGUF's, else ChatML;
    a built-in name (but "chatml") and every template under --no-jinja render through
    libllama's built-in formats."""
    source = model.info.chat_template
    if config.model.chat_template_file:
        source = Path(config.model.chat_template_file).read_text(encoding="utf-8")
    elif config.model.chat_template:
        source = config.model.chat_template
    vocab = model.vocab
    bos = vocab.piece(vocab.bos, special=True).decode("utf-8", "replace") if vocab.bos >= 0 else ""
    eos = vocab.piece(vocab.eos, special=True).decode("utf-8", "replace") if vocab.eos >= 0 else ""
    named = source in builtin_template_names() and source != "chatml"
    if named or not config.model.use_jinja:
        builtin = BuiltinTemplate(
            source or "chatml",
            bos,
            eos,
            apply_builtin,
            add_bos=vocab.add_bos,
            add_eos=vocab.add_eos,
        )
        if builtin.supported():
            return builtin
        log.warning("--no-jinja: libllama has no built-in format for this template: using ChatML")
        return BuiltinTemplate(
            "chatml", bos, eos, apply_builtin, add_bos=vocab.add_bos, add_eos=vocab.add_eos
        )
    if not source or source == "chatml":
        if not source:
            log.warning("the model has no chat template: using ChatML")
        source = CHATML_TEMPLATE
    return ChatTemplate(source, bos, eos, add_bos=vocab.add_bos, add_eos=vocab.add_eos)


def model_name(config: ServerConfig, model: Model) -> str:
    """The API name of the model: the alias, else the file name (as llama-server)."""
    return config.model.alias or Path(model.info.path).name


def build_state(config: ServerConfig, model: Model, engine: Engine) -> ServerState:
    save_dir = Path(config.http.slot_save_path) if config.http.slot_save_path else None
    return ServerState(
        config=config,
        model=model,
        engine=engine,
        template=load_chat_template(config, model),
        model_name=model_name(config, model),
        save_dir=save_dir,
        io=ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvswap-io"),
        publisher=Publisher(save_dir) if save_dir is not None else None,
        lora=LoraScales(engine.adapters.infos),
    )
