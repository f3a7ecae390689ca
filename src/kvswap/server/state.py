"""What HTTP handlers share: the engine client, the vocabulary, the chat template, the config,
the minds' session and the tiers.

Built once at start-up by `loader.build_state`; routes read it with `get_state(request)` (the
loader's state on `app.state.loader`, or while asleep the state it kept). The engine thread
owns every libllama context; handlers only tokenize and render templates here (read-only
vocabulary calls) and post commands through `client`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from fastapi import Request

from kvswap.backend.model import Model
from kvswap.backend.vocab import TokenArray, Vocab
from kvswap.config.settings import ServerConfig
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.keys import PUBLIC_NAMESPACE
from kvswap.engine.client import EngineClient
from kvswap.engine.kv.pagestore import PageStore
from kvswap.engine.snapshot import EngineSnapshot
from kvswap.files import Publisher
from kvswap.minds.chains import StoredChains
from kvswap.minds.runs import Backgrounds
from kvswap.minds.session import MindSession
from kvswap.minds.shared import SharedMinds
from kvswap.server.prometheus import MetricsRenderer
from kvswap.server.requests.lora import LoraScales
from kvswap.server.resumable import ResumableStreams
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import ChatTemplate
from kvswap.tiers.demoter import Demoter
from kvswap.tiers.shared.replica import SharedTier

TENANTS_DIR = ".kvswap-keys"  # each API key's slot files (a name no `filename` can take)


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
    minds: MindSession  # a mind's turn: its lock, claim, read-back (and placement)
    shared: SharedTier | None = None  # the cluster's shared Redis tier (--shared-tier)
    shared_minds: SharedMinds | None = None  # ... as a mind's turn uses it (event loop)
    chains: StoredChains | None = None  # the Responses API's stored conversations, on minds
    backgrounds: Backgrounds = field(default_factory=Backgrounds)  # `background: true` runs
    # each API key's slot files (a keyed server; the key-less one uses `publisher`)
    tenant_files: dict[str, Publisher] = field(default_factory=dict)
    metrics: MetricsRenderer = field(default_factory=MetricsRenderer)
    streams: ResumableStreams = field(
        default_factory=ResumableStreams
    )  # X-Conversation-Id's streams
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

    def slot_files(self, namespace: str) -> Publisher | None:
        """Where tenant `namespace`'s slot files live: the save path itself for a server
        without API keys (llama-server's layout), else a folder of the key's own under
        `<save>/.kvswap-keys/`, so no key can save over, restore or probe another key's files
        by guessing their names (None: no save path)."""
        if self.publisher is None or self.save_dir is None or namespace == PUBLIC_NAMESPACE:
            return self.publisher
        found = self.tenant_files.get(namespace)
        if found is None:
            folder = self.save_dir / TENANTS_DIR / namespace
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            found = self.tenant_files.setdefault(namespace, Publisher(folder))
        return found

    @property
    def store(self) -> PageStore | None:
        """The page store (thread-safe), None when `--page-ram-bytes` is 0."""
        return self.client.pages.store

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
