"""OpenAPI descriptions of request bodies that routes validate themselves.

Routes read raw bodies and validate them with `schemas.parse_body` (so malformed JSON, bad
UTF-8 and wrong types all become llama-server-shaped 400s); `body_schema` still publishes each
body's JSON schema in the app's OpenAPI document, for clients and property-based fuzzing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def body_schema(*models: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route: one model's schema, or `anyOf` the bodies of a
    route whose body depends on its query (POST /slots/{id}: a slot file, or a spill)."""
    schemas = [m.model_json_schema(ref_template="#/components/schemas/{model}") for m in models]
    schema = schemas[0]
    if len(schemas) > 1:
        defs = {k: v for s in schemas for k, v in s.pop("$defs", {}).items()}
        schema = {"anyOf": schemas, **({"$defs": defs} if defs else {})}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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
