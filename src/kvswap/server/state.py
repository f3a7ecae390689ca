"""What HTTP handlers share: the engine client, the vocabulary, the chat template, the config.

Built once by `build_state` at start-up; routes read it from `app.state.kvswap`. The engine
thread owns every libllama context; handlers only tokenize and render templates here (read-only
vocabulary calls) and post commands through `client`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from fastapi import Request

from kvswap.backend.chat_builtin import apply_builtin, builtin_template_names
from kvswap.backend.lora import AdapterInfo
from kvswap.backend.model import Model
from kvswap.backend.vocab import TokenArray, Vocab
from kvswap.config.settings import ServerConfig
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.engine.client import EngineClient
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.snapshot import EngineSnapshot
from kvswap.files import Publisher
from kvswap.files.faults import KILL_AT_STEP_ENV, kill_seam_from_env
from kvswap.server.llama.prometheus import MetricsRenderer
from kvswap.server.pages.cluster import ClusterGate
from kvswap.server.pages.minds import MindGate
from kvswap.server.requests.lora import LoraScales
from kvswap.server.streaming import Runner
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import CHATML_TEMPLATE, ChatTemplate
from kvswap.tiers.demoter import Demoter, MindPolicy
from kvswap.tiers.mindfiles import open_minds
from kvswap.tiers.shared.replica import SharedTier

log = logging.getLogger("kvswap.server")


@dataclass
class ServerState:
    """Shared, read-mostly state of the HTTP front end."""

    config: ServerConfig
    model: Model
    client: EngineClient  # the engine, through its asyncio client
    template: ChatTemplate | BuiltinTemplate
    model_name: str
    save_dir: Path | None
    io: ThreadPoolExecutor  # file I/O off the engine thread and off the event loop
    publisher: Publisher | None  # slot files under --slot-save-path; None: save/restore off
    minds_files: Publisher | None  # the minds' folder of the save path (tiers.mindfiles)
    lora: LoraScales  # the loaded LoRA adapters and their global scales
    demoter: Demoter  # minds between RAM and disk
    minds: MindGate  # minds on the HTTP side
    shared: SharedTier | None = None  # the cluster's shared Redis tier (--shared-tier)
    cluster: ClusterGate | None = None  # a mind's turn in the cluster, HTTP side
    metrics: MetricsRenderer = field(default_factory=MetricsRenderer)
    t_start: float = field(default_factory=time.time)
    sleeping: bool = False  # closed by a sleep: only the read-only routes read it

    @property
    def vocab(self) -> Vocab:
        return self.model.vocab

    @property
    def snapshot(self) -> EngineSnapshot:
        """The engine's last published state (while asleep, the last before the sleep)."""
        snap = self.client.snapshot
        return replace(snap, is_sleeping=True) if self.sleeping else snap

    @property
    def store(self) -> PageStore | None:
        """The page store (thread-safe), None when `--page-ram-bytes` is 0."""
        return self.client.pages.store

    def runner(self) -> Runner:
        """Runs a route's engine requests (a mind's inside its session)."""
        return Runner(self.client, self.minds)

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> TokenArray:
        return self.vocab.tokenize(text, add_special, parse_special)


def get_state(request: Request) -> ServerState:
    """The server state of a request's app (the guard has already answered 503 while loading;
    while asleep, it lets only the read-only routes through, which read the resting state)."""
    loader = request.app.state.loader
    state: ServerState | None = loader.state or loader.resting
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


def build_state(
    config: ServerConfig, model: Model, client: EngineClient, adapters: Sequence[AdapterInfo]
) -> ServerState:
    """What handlers share, around a started engine; the demoter is built, not started."""
    save_dir = Path(config.http.slot_save_path) if config.http.slot_save_path else None
    publisher = None
    if save_dir is not None:
        seam = kill_seam_from_env(os.environ)  # the crash tests' seam (tests/reliability)
        if seam is not None:
            log.warning("%s is set: this server dies at that file step", KILL_AT_STEP_ENV)
        publisher = Publisher(save_dir, seam)
    minds_files = open_minds(save_dir, seam) if save_dir is not None else None
    io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvswap-io")
    demoter = Demoter(
        pages=client.pages,
        post=client.post,
        publisher=minds_files,
        save_dir=save_dir,
        policy=MindPolicy(
            config.paging.page_disk_bytes,
            config.paging.page_disk_drop_lru,
            config.paging.page_flush_seconds,
        ),
        slot_files=publisher,
    )
    shared = cluster = None
    if config.cluster.shared_tier is not None:
        shared = SharedTier(
            config.cluster,
            post=client.post,
            pages=client.pages,
            publisher=minds_files,
            geometry=lambda: client.snapshot.page_geometry,
            forget_files=demoter.forget,
        )
        cluster = ClusterGate(shared, client.pages.registry)
    return ServerState(
        config=config,
        model=model,
        client=client,
        template=load_chat_template(config, model),
        model_name=model_name(config, model),
        save_dir=save_dir,
        io=io,
        publisher=publisher,
        minds_files=minds_files,
        lora=LoraScales(adapters),
        demoter=demoter,
        minds=MindGate(client, demoter, minds_files, io, cluster),
        shared=shared,
        cluster=cluster,
    )
