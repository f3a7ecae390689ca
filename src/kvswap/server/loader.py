"""Loads the model and builds the engine in a thread while HTTP already answers.

Owns the model, the engine and the server state from load to `close`; `build_state` composes
what handlers share around a started engine (the demoter, the shared tier, the minds' session). `ready()` tells the guard
whether to answer 503 "Loading model"; a failure is kept in `error` and reported through
`on_failure` (the server then exits, as llama-server does when a model fails to load).

`sleep` keeps what the running server had changed since start-up (its `Resume`: the live
geometry, so n_ctx, n_parallel, batch sizes and KV types after any reconfigure, and the LoRA
global scales) and the closed state (`resting`, what the read-only routes answer while asleep);
`wake` builds the engine with that geometry and those scales, not the start-up flags, so every
mind spilled at sleep (its files carry the live KV types) is served again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvswap.backend.chat_builtin import apply_builtin, builtin_template_names
from kvswap.backend.lora import AdapterInfo, Adapters
from kvswap.backend.model import Model, ModelLoadError
from kvswap.config.settings import ServerConfig
from kvswap.core.keys import PageKey
from kvswap.engine.client import EngineClient
from kvswap.engine.plan.geometry import Geometry
from kvswap.files import Publisher
from kvswap.files.faults import KILL_AT_STEP_ENV, kill_seam_from_env
from kvswap.minds.chains import StoredChains
from kvswap.minds.diskseed import DiskSeeds
from kvswap.minds.session import MindSession
from kvswap.minds.shared import SharedMinds
from kvswap.minds.stored.replicated import ReplicatedRecords
from kvswap.minds.stored.store import StoredRecords
from kvswap.minds.turnfile import load_turns, save_turns
from kvswap.server.enginebuild import Built, build_engine
from kvswap.server.prefetch import ModelPrefetch, target_params, target_path
from kvswap.server.requests.lora import LoraScales
from kvswap.server.state import ServerState
from kvswap.text.builtin_template import BuiltinTemplate
from kvswap.text.template import CHATML_TEMPLATE, ChatTemplate
from kvswap.tiers.demoter import Demoter, MindPolicy
from kvswap.tiers.mindfiles import file_name, open_minds, tokens_on_disk
from kvswap.tiers.shared.replica import SharedTier
from kvswap.tiers.slotfiles import ReadState, read_state

log = logging.getLogger("kvswap.server")

STATE_DIR = ".kvswap-state"  # the stored conversations' folder under the save path
SWEEP_S = 60.0  # how often the stored conversations' retention runs on an idle server


@dataclass(frozen=True)
class Resume:
    """What a sleeping server wakes with instead of the start-up flags."""

    geometry: Geometry  # the live geometry when it fell asleep
    lora_scales: tuple[float, ...]  # the adapters' global scales (POST /lora-adapters)


class Loader:
    """Loads in the background; see the module docstring."""

    def __init__(self, config: ServerConfig, prefetch: ModelPrefetch[Built] | None = None) -> None:
        self.config = config
        self.prefetch = prefetch  # the weights and engine already loading (serve.run), taken once
        self.state: ServerState | None = None
        self.error: BaseException | None = None
        self.on_failure: Callable[[], None] = lambda: None
        self._thread: threading.Thread | None = None
        self.adapters: Adapters | None = None  # freed after the engine, before the model
        self.draft_model: Model | None = None
        # Where the bound sockets listen (serve.run), logged once the model is loaded.
        self.listening: tuple[str, ...] = ()
        self.resume: Resume | None = None  # set while asleep: what the wake restores
        self.resting: ServerState | None = None  # the closed state of a sleeping server
        # The stored conversations: opened once, kept over a sleep (an in-memory one too).
        self.state_store: StoredRecords | None = None
        self._sweeper: concurrent.futures.Future[None] | None = None

    def ready(self) -> bool:
        """Loaded (awake, or asleep with the answers of its read-only routes)."""
        return self.state is not None or self.resting is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load in the background, reporting to `loop` (which may not run yet); once only."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._load, args=(loop,), name="kvswap-loader", daemon=True
        )
        self._thread.start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            t0 = time.perf_counter()
            model, built = self._take_prefetched()
            resume = self.resume
            if built is None:  # (a wake: nothing was prefetched)
                geometry = resume.geometry if resume is not None else None
                built = build_engine(self.config, model, geometry)
            self.adapters, self.draft_model = built.adapters, built.draft_model
            client = built.engine.connect(loop)
            if self.state_store is None and self.config.cluster.shared_tier is None:
                self.state_store = open_state_store(self.config)
            state = build_state(self.config, model, client, built.adapters.infos, self.state_store)
            assert state.chains is not None
            self._sweeper = asyncio.run_coroutine_threadsafe(
                state.chains.sweep_forever(SWEEP_S), loop
            )
            if resume is not None:
                state.lora.scales = list(resume.lora_scales)
            snap = client.snapshot
            state.demoter.start(snap.page_geometry)
            if state.shared is not None:
                state.shared.start()
            self.state = state
            log.info(
                "model loaded in %.0f ms: %s (%s); n_ctx = %d, n_parallel = %d, n_ctx_slot = %d, kv_unified = %s",
                (time.perf_counter() - t0) * 1e3,
                target_path(self.config),
                model.info.desc,
                snap.n_ctx,
                snap.geometry.n_parallel,
                snap.n_ctx_slot,
                snap.geometry.kv_unified,
            )
            log.info("server is listening on %s", ", ".join(self.listening))
        except ModelLoadError as err:
            self.error = err  # a missing or unreadable file: the one line at exit says it all
            loop.call_soon_threadsafe(lambda: self.on_failure())
        except Exception as err:
            log.debug("model loading failed", exc_info=True)  # -v shows where
            self.error = err
            # Read when the loop runs: a load that fails fast may beat `serve` setting it.
            loop.call_soon_threadsafe(lambda: self.on_failure())

    def _take_prefetched(self) -> tuple[Model, Built | None]:
        """The target model, and on the first load the engine built on it (`serve` began both
        while the HTTP stack imported); on a wake the model is loaded here."""
        prefetch, self.prefetch = self.prefetch, None  # the first load only
        if prefetch is not None:
            return prefetch.take()
        return Model.load(target_path(self.config), target_params(self.config)), None

    def before_exit(self) -> None:
        """Spill every mind to disk (SIGTERM, normal exit): called while the engine runs."""
        if self._thread is not None:
            self._thread.join()
        if self.state is not None:
            _drain(self.state)

    def sleep(self) -> None:
        """`--sleep-idle-seconds`: spill every mind, free the engine, contexts and models; keep
        the live geometry and LoRA scales for the wake, and the closed state for the read-only
        routes."""
        state = self.state
        if state is not None:
            self.resume = Resume(state.snapshot.geometry, tuple(state.lora.scales))
            self.resting = state  # answers the read-only routes from the moment it closes
        self.close()
        if state is not None:
            state.sleeping = True

    def wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load the model and contexts again (on the caller's thread) with the geometry and
        LoRA scales in force when the server fell asleep; minds spilled under the save path are
        served as after a restart."""
        self._thread = None
        self._load(loop)
        if self.error is not None:
            raise RuntimeError(f"could not load the model again after sleeping: {self.error}")
        self.resume = None
        self.resting = None

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()

        state = self.state
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if state is not None:
            _drain(state)
            if state.shared_minds is not None:
                state.shared_minds.close()
            if state.shared is not None:
                state.shared.close()
            state.client.close()
            state.io.shutdown(wait=True)
            for publisher in (state.publisher, state.minds_files, *state.tenant_files.values()):
                if publisher is not None:
                    publisher.close()
            if self.adapters is not None:
                self.adapters.close()
            state.model.close()
            self.state = None
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None


def _drain(state: ServerState) -> None:
    """Everything a leaving server must not lose, while its engine still runs (SIGTERM, sleep,
    close): first every mind spilled to this replica's disk (local, fast, and what a grace
    period must never run out before: a Redis that is slow or away cannot delay it), then in
    a cluster every dirty mind published to the shared tier and every lease released, within
    `--shared-tier-drain-seconds`, so the minds resume elsewhere with no wait."""
    state.demoter.close(engine_alive=state.snapshot.crashed is None)
    if state.shared is not None:
        state.shared.drain()
    elif state.save_dir is not None:  # each mind's last turn, for its first one after a restart
        try:
            save_turns(state.minds.histories, state.save_dir)
        except OSError as err:
            log.error("the minds' last turns could not be written: %s", err)


def open_state_store(config: ServerConfig) -> StoredRecords:
    """The stored conversations' database: under `--state-dir`, else the save path's
    `.kvswap-state/`, else in memory (said in one line)."""
    state, save = config.state, config.http.slot_save_path
    folder = state.state_dir or (str(Path(save) / STATE_DIR) if save else None)
    store = StoredRecords(
        Path(folder) if folder else None, ttl_s=state.ttl_s, budget_bytes=state.budget_bytes
    )
    log.info("%s", store.describe())
    return store


def build_state(
    config: ServerConfig,
    model: Model,
    client: EngineClient,
    adapters: Sequence[AdapterInfo],
    state_store: StoredRecords | None = None,
) -> ServerState:
    """What handlers share, around a started engine; the demoter is built, not started."""
    save_dir = Path(config.http.slot_save_path) if config.http.slot_save_path else None
    publisher = minds_files = None
    if save_dir is not None:
        seam = kill_seam_from_env(os.environ)  # the crash tests' seam (tests/reliability)
        if seam is not None:
            log.warning("%s is set: this server dies at that file step", KILL_AT_STEP_ENV)
        publisher = Publisher(save_dir, seam)
        minds_files = open_minds(save_dir, seam)
    io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvswap-io")
    demoter = _demoter(config, client, save_dir, publisher, minds_files)
    shared = _shared_tier(config, client, minds_files, demoter)
    shared_minds = SharedMinds(shared) if shared is not None else None
    minds = MindSession(
        registry=client.pages.registry,
        store=client.pages.store,
        claims=demoter,
        post=client.post,
        snapshot=lambda: client.snapshot,
        io=io,
        read_back=_mind_reader(minds_files, client),
        shared=shared_minds,
        seeds=_disk_seeds(minds_files, client) if shared is None else None,
    )
    load_turns(minds.histories, save_dir if shared is None else None)  # (the last exit's)
    # A cluster's stored conversations live in the shared tier's log.
    store = _replicated(config, shared) if shared is not None else state_store
    chains = StoredChains(store, session=minds, client=client, io=io) if store is not None else None
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
        minds=minds,
        shared=shared,
        shared_minds=shared_minds,
        chains=chains,
    )


def _replicated(config: ServerConfig, shared: SharedTier) -> ReplicatedRecords:
    store = ReplicatedRecords(
        shared, ttl_s=config.state.ttl_s, budget_bytes=config.state.budget_bytes
    )
    log.info("%s", store.describe())
    return store


def _demoter(
    config: ServerConfig,
    client: EngineClient,
    save_dir: Path | None,
    publisher: Publisher | None,
    minds_files: Publisher | None,
) -> Demoter:
    """The demoter (built, not started): minds between RAM and disk, under the paging flags."""
    paging = config.paging
    return Demoter(
        pages=client.pages,
        post=client.post,
        publisher=minds_files,
        save_dir=save_dir,
        policy=MindPolicy(
            paging.page_disk_bytes, paging.page_disk_drop_lru, paging.page_flush_seconds
        ),
        slot_files=publisher,
    )


def _shared_tier(
    config: ServerConfig, client: EngineClient, minds_files: Publisher | None, demoter: Demoter
) -> SharedTier | None:
    """The cluster's shared tier (`--shared-tier`), or None."""
    if config.cluster.shared_tier is None:
        return None
    return SharedTier(
        config.cluster,
        post=client.post,
        pages=client.pages,
        publisher=minds_files,
        geometry=lambda: client.snapshot.page_geometry,
        forget_files=demoter.forget,
    )


def _disk_seeds(minds_files: Publisher | None, client: EngineClient) -> DiskSeeds | None:
    """New minds may start from their tenant's minds on disk (`minds.diskseed`), read from the
    token header of their files; None without a disk tier or a page store."""
    store = client.pages.store
    if minds_files is None or store is None:
        return None
    return DiskSeeds(client.pages.registry, store, lambda key: tokens_on_disk(minds_files, key))


def _mind_reader(
    minds_files: Publisher | None, client: EngineClient
) -> Callable[[PageKey], ReadState] | None:
    """A mind's disk copy read back (on an I/O worker) under the engine's live page layout: its
    file mapped, its pages read in (`files.mapping`: the minds' folder is kvswap's alone), its
    sidecars into buffers off the page store's shelf (`tiers.slotfiles.ReadBuffers`)."""
    if minds_files is None:
        return None

    def read(key: PageKey) -> ReadState:
        geometry = client.snapshot.page_geometry
        t0 = time.perf_counter()
        state = read_state(minds_files, file_name(key), geometry, client.pages.store, mapped=True)
        client.pages.registry.count(
            read_ms_total=(time.perf_counter() - t0) * 1e3, read_bytes_total=state.n_bytes_read
        )
        return state

    return read


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
