"""Making a large request ready off the event loop.

Parsing a body, rendering its chat template, tokenizing it and checking its grammar are pure CPU:
a 100k-token conversation takes a large fraction of a second, and on the event loop that stalls
every other client's stream for as long. `prepared(raw, fn)` runs `fn` (a route's preparation:
everything from the raw body to its engine requests) inline for a body under `OFFLOAD_BYTES`,
where a thread hop would cost more than the work, and in a worker thread (`asyncio.to_thread`)
for a larger one. The work itself is unchanged: vocabulary calls and template rendering are
read-only and safe on any thread, and grammar checks were already made off the engine
thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

# About 4k tokens of text: below it, preparing takes well under a millisecond.
OFFLOAD_BYTES: Final = 16 * 1024


async def prepared(raw: bytes | int, fn: Callable[[], T]) -> T:
    """`fn()`, in a worker thread when the body (`raw`, or its size) is `OFFLOAD_BYTES` or more."""
    n_bytes = raw if isinstance(raw, int) else len(raw)
    if n_bytes < OFFLOAD_BYTES:
        return fn()
    return await asyncio.to_thread(fn)
