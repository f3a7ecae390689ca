"""Loading the weights, then building the engine, while the HTTP stack imports: a shorter
start-up.

Owns `ModelPrefetch` and the target model's path and load parameters (`target_path`,
`target_params`). `kvswap serve` starts a prefetch as soon as its flags and paths are checked,
before it imports FastAPI, the routes and the engine; once it has imported the engine it hands
the prefetch the engine's builder (`then`), and the same thread builds the engine on the loaded
model: its contexts made, the weights faulted in by the warm-up decode, its thread started.
libllama loads and decodes without holding the GIL, so both overlap the imports. The loader
then takes the model and the engine (`take`) instead of making them again. A failure is raised
where the loader would have raised it. Only this module and `backend.model` are imported before
the load starts, and the thread imports nothing itself (the builder comes imported), so no
import runs on two threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from kvswap.backend.model import Model, ModelParams
from kvswap.config.settings import ServerConfig
from kvswap.models import default_model_path

Built = TypeVar("Built")  # what `then` builds on the model (the server's: `enginebuild.Built`)


def target_path(config: ServerConfig) -> str:
    return config.model.path or str(default_model_path())


def target_params(config: ServerConfig) -> ModelParams:
    return ModelParams(
        n_gpu_layers=config.model.n_gpu_layers,
        use_mmap=config.model.use_mmap,
        use_mlock=config.model.use_mlock,
        kv_overrides=config.model.kv_overrides,
    )


class ModelPrefetch(Generic[Built]):
    """One model load on a thread of its own, then what `then` builds on it; `take()` hands
    them over once."""

    def __init__(self, config: ServerConfig) -> None:
        self._path = target_path(config)
        self._params = target_params(config)
        self._model: Model | None = None
        self._build: Callable[[Model], Built] | None = None
        self._built: Built | None = None
        self._given = threading.Event()  # `then` was called, or `take` stopped waiting for it
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._load, name="kvswap-prefetch", daemon=True)
        self._thread.start()

    def then(self, build: Callable[[Model], Built]) -> None:
        """Build on the model on this thread once it is loaded (once, before `take`)."""
        self._build = build
        self._given.set()

    def _load(self) -> None:
        try:
            self._model = Model.load(self._path, self._params)
            self._given.wait()
            if self._build is not None:
                self._built = self._build(self._model)
        except Exception as err:  # handed to the loader, which reports it
            self._error = err

    def take(self) -> tuple[Model, Built | None]:
        """The loaded model and what was built on it (None when `then` was never called):
        waits for them, or raises the load's or the build's exception."""
        self._given.set()  # nothing will be handed over now
        self._thread.join()
        if self._error is not None:
            raise self._error
        model, self._model = self._model, None
        assert model is not None, "ModelPrefetch.take() is called once"
        return model, self._built
