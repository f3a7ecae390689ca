"""A mind's last chat turn in the shared tier, so that its next turn on any replica continues
the mind's own tokens for the last answer instead of prefilling it again (`minds.histories`;
without a cluster the turn stays in the replica's memory and `minds.turnfile` keeps it across
a restart).

The record is written with the turn's tokens, in the same fenced script (`kv:{h}:chat`,
`tiers.shared.token_log`), and read with them when a replica takes the mind over
(`tiers.shared.resume`). It holds no copy of the token log: it names the turn id it belongs to
and the log's length after it, and carries only the answer's tokens past the log (the last
sampled token is not in the KV). Read against a log whose last turn is another one (a turn
without a chat record, a log rewritten after Redis was away, an older replica's write), it is
ignored and the turn's prompt is the whole conversation rendered: one answer prefilled again,
never a wrong token (the record is matched against the prompt a client sends, as any last
turn is). Pure: JSON and numpy.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Final

import numpy as np
import numpy.typing as npt

from kvswap.minds.histories import LastTurn

log = logging.getLogger("kvswap.minds")

_VERSION: Final = 1


def encode_record(turn_id: str, turn: LastTurn, n_log: int) -> bytes:
    """The record of `turn`, whose first `n_log` tokens are the token log after turn `turn_id`."""
    tail = np.asarray(turn.tokens[n_log:], dtype="<i4").tobytes()
    doc = {
        "version": _VERSION,
        "turn": turn_id,
        "n_log": n_log,
        "tail": base64.b64encode(tail).decode(),
        **turn.fields(),
    }
    return json.dumps(doc).encode()


def decode_record(raw: bytes, log_tokens: npt.NDArray[np.int32], turn_id: str) -> LastTurn | None:
    """The last turn `raw` records, over the token log `log_tokens` whose last turn is
    `turn_id`; None when there is none, it belongs to another turn, or it does not read."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("version") != _VERSION or doc["turn"] != turn_id:
            return None
        if int(doc["n_log"]) != len(log_tokens):
            return None
        tail = np.frombuffer(base64.b64decode(doc["tail"]), dtype="<i4").astype(np.int32)
        return LastTurn.of_fields(np.concatenate([log_tokens, tail]), doc)
    except (ValueError, KeyError, TypeError) as err:
        log.warning("a mind's chat record in the shared tier does not read (%s): ignored", err)
        return None
