"""llama-server's resumable streams: a streamed answer whose request carried `X-Conversation-Id`
keeps running when its client leaves, its bytes kept so a client can read them again.

- `ResumableStreams` holds one `ResumableStream` per conversation id, in the caller's tenant namespace
  (another API key's id names another stream). A request with the header replaces (cancels)
  the conversation's previous stream as it arrives (`replace`), and its answer, once streaming,
  is produced by a task of its own into a new `ResumableStream` (`start`): the client reads it from
  offset 0 and may leave; only `DELETE /v1/stream` (`stop`) cancels the generation.
- A `ResumableStream` is a byte buffer of at most `MAX_BYTES` (the oldest bytes drop first; a read
  from below what was dropped is refused), read from any offset by any number of readers, each
  woken as bytes arrive, until the producer ends it.
- A finished stream is kept `TTL_S` seconds after it ended, then forgotten (swept whenever the
  registry is used); at exit every stream is ended, so no reader waits forever.

Constants as llama-server's `server-stream.cpp` (4 MiB, 300 s). The routes are
`server.llama.routes_stream`; the producer side is `server.streaming.open_stream`. Runs on the
event loop only; no engine, no I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

MAX_BYTES = 4 << 20  # kept per stream: llama-server's STREAM_SESSION_MAX_BYTES
TTL_S = 300.0  # a finished stream is kept this long: STREAM_SESSION_TTL_SECONDS

StreamKey = tuple[str, str]  # (tenant namespace, conversation id)


class OffsetLost(Exception):
    """A read from an offset below the bytes the stream dropped."""


@dataclass
class ResumableStream:
    """One streamed answer's bytes; see the module docstring."""

    conversation_id: str
    t_started_unix_s: float = field(default_factory=time.time)
    t_ended_unix_s: float = 0.0  # 0: still being produced
    n_dropped: int = 0  # bytes dropped from the front (the buffer holds what follows)
    cancelled: bool = False
    producer: asyncio.Task[None] | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.t_ended_unix_s > 0

    @property
    def n_bytes(self) -> int:
        """Bytes that ever entered the stream."""
        return self.n_dropped + len(self._buffer)

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._buffer += data
        over = len(self._buffer) - MAX_BYTES
        if over > 0:
            del self._buffer[:over]
            self.n_dropped += over
        self._wake()

    def end(self) -> None:
        """No more bytes: readers drain what is left and stop."""
        if not self.done:
            self.t_ended_unix_s = time.time()
            self._wake()

    def cancel(self) -> None:
        """Stop the generation (its task) and end the stream."""
        self.cancelled = True
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
        self.end()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """The stream's bytes from `offset` on, as they come, until it ends; OffsetLost when
        `offset` is below what was dropped (checked first, and as it reads)."""
        while True:
            if offset < self.n_dropped:
                raise OffsetLost()
            if offset < self.n_bytes:
                chunk = bytes(self._buffer[offset - self.n_dropped :])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            await self._changed.wait()


class ResumableStreams:
    """Every tenant's conversation streams; see the module docstring."""

    def __init__(self) -> None:
        self._streams: dict[StreamKey, ResumableStream] = {}

    def replace(self, key: StreamKey) -> None:
        """A request for conversation `key` arrived: its previous stream is cancelled and
        forgotten (one conversation, one live stream)."""
        self._sweep()
        old = self._streams.pop(key, None)
        if old is not None:
            old.cancel()

    def start(self, key: StreamKey, produce: AsyncIterator[bytes]) -> ResumableStream:
        """A new stream for `key`, filled by a task running `produce` to its end (or to a
        `stop`), whoever reads it."""
        self.replace(key)
        stream = ResumableStream(key[1])
        self._streams[key] = stream
        stream.producer = asyncio.ensure_future(_pump(produce, stream))
        return stream

    def get(self, key: StreamKey) -> ResumableStream | None:
        self._sweep()
        return self._streams.get(key)

    def stop(self, key: StreamKey) -> None:
        """DELETE /v1/stream: cancel the conversation's generation and forget its stream
        (nothing to stop is no error)."""
        stream = self._streams.pop(key, None)
        if stream is not None:
            stream.cancel()

    def lookup(self, namespace: str, ids: Iterable[str]) -> list[ResumableStream]:
        """The streams of `namespace` whose id is one of `ids` or `<id>::<model>`."""
        self._sweep()
        wanted = [i for i in ids if i]
        return [
            s
            for (ns, conv), s in self._streams.items()
            if ns == namespace and any(conv == i or conv.startswith(i + "::") for i in wanted)
        ]

    def close(self) -> None:
        """At exit: every generation cancelled, every stream ended."""
        for stream in self._streams.values():
            stream.cancel()
        self._streams.clear()

    def _sweep(self) -> None:
        cutoff = time.time() - TTL_S
        for key in [k for k, s in self._streams.items() if s.done and s.t_ended_unix_s < cutoff]:
            del self._streams[key]


async def _pump(produce: AsyncIterator[bytes], stream: ResumableStream) -> None:
    """Move the answer's bytes into the stream; its end (or cancellation) ends the stream and
    closes the answer (which cancels its engine requests and lets the mind go)."""
    try:
        async for chunk in produce:
            stream.append(chunk)
    finally:
        stream.end()
        aclose = getattr(produce, "aclose", None)
        if aclose is not None:
            await aclose()
