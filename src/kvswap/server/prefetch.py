"""Loading the weights while the HTTP stack imports: a shorter start-up.

Owns `ModelPrefetch` and the target model's path and load parameters (`target_path`,
`target_params`). `kvswap serve` starts a prefetch as soon as its flags and paths are checked,
before it imports FastAPI, the routes and the engine (about as long as loading a small model);
libllama loads without holding the GIL, so the two overlap. The loader then takes the model
instead of loading it again. A failed load is raised where the loader would have raised it.
Only this module and `backend.model` are imported before the load starts.
"""

from __future__ import annotations

import threading

from kvswap.backend.model import Model, ModelParams
from kvswap.config.settings import ServerConfig
from kvswap.models import default_model_path


def target_path(config: ServerConfig) -> str:
    return config.model.path or str(default_model_path())


def target_params(config: ServerConfig) -> ModelParams:
    return ModelParams(
        n_gpu_layers=config.model.n_gpu_layers,
        use_mmap=config.model.use_mmap,
        use_mlock=config.model.use_mlock,
    )


class ModelPrefetch:
    """One model load on a thread of its own; `take()` hands the model over once."""

    def __init__(self, config: ServerConfig) -> None:
        self._path = target_path(config)
        self._params = target_params(config)
        self._model: Model | None = None
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._load, name="kvswap-prefetch", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            self._model = Model.load(self._path, self._params)
        except Exception as err:  # handed to the loader, which reports it
            self._error = err

    def take(self) -> Model:
        """The loaded model (waits for it), or the load's exception."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        model, self._model = self._model, None
        assert model is not None, "ModelPrefetch.take() is called once"
        return model
