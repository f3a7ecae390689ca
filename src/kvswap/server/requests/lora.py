"""The LoRA adapters as HTTP sees them: global scales, and each request's set.

Owns the global scales (`GET/POST /lora-adapters`, as llama-server's `params_base.lora_adapters`)
and the mapping of a request's `lora` field onto the engine's `LoraSet`: a request that names
adapters runs those at the given scales and every other one off; a request without the field
(or with an empty list) runs the global scales as they are when it arrives. Unlike llama-server,
which silently ignores an unknown adapter id, an id that is not loaded is a typed 400.

Lives on the event loop (POST changes the scales between requests); no libllama, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kvswap.backend.lora import AdapterInfo
from kvswap.core.errors import ErrorKind, KvswapError
from kvswap.core.types import LoraSet
from kvswap.engine.plan.lora import lora_set
from kvswap.server.requests.schemas import LoraEntry, validation_message

_ENTRIES = TypeAdapter(list[LoraEntry])


def parse_entries(raw: bytes) -> list[LoraEntry]:
    """POST /lora-adapters' body: `[{"id", "scale"}, ...]`; anything else is a typed 400."""
    try:
        return _ENTRIES.validate_json(raw)
    except ValidationError as exc:
        message = validation_message(exc)
        if "valid list" in message or "valid array" in message:
            message = "Request body must be an array"
        raise KvswapError(ErrorKind.INVALID_REQUEST, message) from exc


class LoraScales:
    """The loaded adapters and their current global scales."""

    def __init__(self, adapters: Sequence[AdapterInfo]) -> None:
        self.adapters = tuple(adapters)
        self.scales = [a.scale for a in self.adapters]

    def _checked(self, entries: Sequence[LoraEntry]) -> dict[int, float]:
        """{id: scale}, a later entry for an id winning (llama-server's map)."""
        bad = sorted({e.id for e in entries if e.id >= len(self.adapters)})
        if bad:
            raise KvswapError(
                ErrorKind.INVALID_REQUEST,
                f"unknown LoRA adapter id {bad[0]} ({len(self.adapters)} adapter(s) loaded; "
                "see GET /lora-adapters)",
            )
        return {e.id: e.scale for e in entries}

    def set_global(self, entries: Sequence[LoraEntry]) -> None:
        """POST /lora-adapters: the listed adapters take their scales, the others 0."""
        scales = self._checked(entries)
        self.scales = [scales.get(i, 0.0) for i in range(len(self.adapters))]

    def for_request(self, entries: Sequence[LoraEntry] | None) -> tuple[LoraSet, LoraSet]:
        """(the set the request runs under, its `lora` field as reported in /slots)."""
        if not entries:
            return lora_set(enumerate(self.scales)), ()
        asked = self._checked(entries)
        return lora_set(asked.items()), tuple(sorted(asked.items()))

    def adapters_json(self) -> list[dict[str, Any]]:
        """GET /lora-adapters, as llama-server's `server_task_result_get_lora`."""
        return [
            {
                "id": a.id,
                "path": a.path,
                "scale": self.scales[a.id],
                "task_name": a.task_name,
                "prompt_prefix": a.prompt_prefix,
            }
            for a in self.adapters
        ]
