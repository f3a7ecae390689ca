"""OpenAPI descriptions of request bodies that routes validate themselves.

Routes read raw bodies and validate them with `schemas.parse_body` (so malformed JSON, bad
UTF-8 and wrong types all become llama-server-shaped 400s); `body_schema` still publishes each
body's JSON schema in the app's OpenAPI document, for clients and property-based fuzzing.

The schemas are built when the document is first asked for (`resolve_bodies`), not when the
routes are declared: building all of them at import cost a cold start about a tenth of the app's
import time, for a document most servers never serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

_BODY_MODEL = "x-kvswap-body-model"  # a route's openapi_extra, until resolved


def body_schema(*models: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra` naming its body models (resolved by `resolve_bodies`): one
    model, or several for a route whose body depends on its query (POST /slots/{id}: a slot
    file, or a spill)."""
    return {_BODY_MODEL: models}


def resolve_bodies(routes: Iterable[object]) -> None:
    """Replace each route's body models (from `body_schema`) by the body's JSON schema: one
    model's schema, or `anyOf` theirs."""
    for route in routes:
        extra = getattr(route, "openapi_extra", None)
        if not isinstance(extra, dict) or _BODY_MODEL not in extra:
            continue
        models: tuple[type[BaseModel], ...] = extra.pop(_BODY_MODEL)
        ref = "#/components/schemas/{model}"
        schemas = [m.model_json_schema(ref_template=ref) for m in models]
        schema = schemas[0]
        if len(schemas) > 1:
            defs = {k: v for s in schemas for k, v in s.pop("$defs", {}).items()}
            schema = {"anyOf": schemas, **({"$defs": defs} if defs else {})}
        extra["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }


def hoist_defs(document: dict[str, Any]) -> dict[str, Any]:
    """Move every request body schema's `$defs` into `components.schemas`, where its
    `#/components/schemas/...` references point."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for path in document.get("paths", {}).values():
        for operation in path.values():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                defs = media.get("schema", {}).pop("$defs", None)
                if defs:
                    components.update(defs)
    return document
