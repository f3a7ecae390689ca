"""Responses items as the store keeps them and the API shows them: each with its `id`.

A request's `input` (a string, or items) becomes stored items: a string is one user message;
a message's string content becomes one `input_text` part (`output_text` for an assistant's);
every item gets an id when it has none (`msg_`, `fc_`, `fco_`, `rs_` and 32 random
characters) and a `status` of "completed". Items keep every other field as sent, so the chat
translation (`schemas_responses.to_chat_body`) reads them as it reads a request's input, and
its typed 400s name the item at fault. Pure.
"""

from __future__ import annotations

import secrets
import string
from typing import Any

from kvswap.core.errors import ErrorKind, KvswapError

Item = dict[str, Any]
_ALNUM = string.ascii_letters + string.digits
_PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "reasoning": "rs_",
}
# OpenAI's limits on a conversation: items per create or add, metadata pairs and lengths.
MAX_NEW_ITEMS = 20
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(32))


def stored_items(raw: str | list[Any], where: str = "input") -> list[Item]:
    """A request's input as items with ids (see the module docstring)."""
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise KvswapError(
                ErrorKind.INVALID_REQUEST, f"{where}[{i}]: an input item must be an object"
            )
        items.append(_stored(dict(item)))
    return items


def _stored(item: Item) -> Item:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind is not None:
        item["type"] = kind
    if kind == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        text_part: Item = {"type": part, "text": item["content"]}
        if part == "output_text":
            text_part["annotations"] = []
        item["content"] = [text_part]
    if not isinstance(item.get("id"), str) or not item["id"]:
        item["id"] = new_id(_PREFIXES.get(str(kind), "item_"))
    item.setdefault("status", "completed")
    return item


def metadata(raw: Any, param: str = "metadata") -> dict[str, str]:
    """A conversation's metadata checked against OpenAI's limits (typed 400 naming `param`)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _invalid(f"Invalid '{param}': expected an object of strings.", param)
    if len(raw) > MAX_METADATA_PAIRS:
        raise _invalid(
            f"Invalid '{param}': too many pairs ({len(raw)}), at most {MAX_METADATA_PAIRS}.",
            param,
        )
    for key, value in raw.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise _invalid(
                f"Invalid '{param}': a key is {len(key)} characters, at most "
                f"{MAX_METADATA_KEY_CHARS}.",
                param,
            )
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise _invalid(
                f"Invalid '{param}.{key}': expected a string of at most "
                f"{MAX_METADATA_VALUE_CHARS} characters.",
                param,
            )
    return dict(raw)


def new_items(raw: Any, param: str = "items") -> list[Item]:
    """Items to add to a conversation: at most 20 (OpenAI's limit), with ids."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid(f"Invalid '{param}': expected an array of items.", param)
    if len(raw) > MAX_NEW_ITEMS:
        raise _invalid(
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{MAX_NEW_ITEMS}, but got an array with length {len(raw)} instead.",
            param,
        )
    return stored_items(raw, param)


def _invalid(message: str, param: str) -> KvswapError:
    return KvswapError(ErrorKind.INVALID_REQUEST, message, param=param)
