"""A TCP fault proxy for the cluster's fault-injection tests: clients connect to it, it connects
each of them to one upstream server (Redis), and a test switches the fault at run time.

No packaged proxy fits: toxiproxy is not in Debian (bookworm) nor on PyPI as a server (only
its clients), and Debian's simpleproxy/6tunnel forward without faults.

Modes (`Mode`), applied to the connections already open as well as to new ones:
- `PASS`: bytes go both ways unchanged.
- `DELAY`: every chunk, either way, waits `delay_ms` before it is passed on (order kept).
- `DROP_REPLY`: requests reach the server; its reply is thrown away and the client's connection
  is reset once a reply byte arrives (a reply lost after the command ran: the client cannot
  tell whether it ran). With `n_drops`, only that many replies are lost, then the mode goes
  back to `PASS` (a client's retry then gets its answer).
- `RESET`: every open connection is reset now (TCP RST), and each new one as soon as accepted.
- `BLACKHOLE`: connections are accepted and kept open, and nothing passes either way (a
  partition: the client's own timeout is all it gets).

The proxy runs an asyncio loop on its own thread; `mode`, `set` and the counters are safe to
use from the test's thread. `n_requests_up` counts chunks that reached the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType

_CHUNK_BYTES = 64 << 10


class Mode(StrEnum):
    PASS = "pass"
    DELAY = "delay"
    DROP_REPLY = "drop_reply"
    RESET = "reset"
    BLACKHOLE = "blackhole"


@dataclass(eq=False)  # one per connection, hashed by identity
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees 'connection reset'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """See the module docstring. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = Mode.PASS
        self.delay_ms = 0
        self.n_drops_left: int | None = None  # DROP_REPLY: replies still to drop (None: all)
        self.n_connections = 0
        self.n_requests_up = 0  # client chunks passed to the server
        self.n_replies_dropped = 0
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    # -- the test's side --------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def set(self, mode: Mode, delay_ms: int = 0, n_drops: int | None = None) -> None:
        """Switch the fault; `RESET` resets every open connection before this returns;
        `n_drops`: `DROP_REPLY` drops that many replies, then passes again."""
        self.delay_ms = delay_ms
        self.n_drops_left = n_drops
        self.mode = mode
        if mode is Mode.RESET:
            asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(10)

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- the loop's side ----------------------------------------------------------------------

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._reset_all()
        await self._server.wait_closed()

    async def _reset_all(self) -> None:
        for link in list(self._links):
            _reset(link.client)
            if link.server is not None:
                _reset(link.server)
        self._links.clear()

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.n_connections += 1
        if self.mode is Mode.RESET:
            _reset(c_writer)
            return
        link = _Link(c_writer)
        self._links.add(link)
        try:
            s_reader, link.server = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(c_writer)
            self._links.discard(link)
            return
        up = asyncio.create_task(self._pump(c_reader, link.server, link, upstream=True))
        down = asyncio.create_task(self._pump(s_reader, c_writer, link, upstream=False))
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
        for writer in (c_writer, link.server):
            writer.transport.abort()
        self._links.discard(link)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        upstream: bool,
    ) -> None:
        """One direction of one connection, under the current mode, until either side ends
        (a reset or a close of either: `_accept` then closes the other side)."""
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(_CHUNK_BYTES):
                mode = self.mode
                if mode is Mode.BLACKHOLE:
                    continue  # swallowed; the connection stays open
                if mode is Mode.DELAY:
                    await asyncio.sleep(self.delay_ms / 1000)
                if mode is Mode.DROP_REPLY and not upstream:
                    self.n_replies_dropped += 1
                    if self.n_drops_left is not None:
                        self.n_drops_left -= 1
                        if self.n_drops_left <= 0:
                            self.mode = Mode.PASS
                    _reset(link.client)
                    return
                writer.write(chunk)
                await writer.drain()
                if upstream:
                    self.n_requests_up += 1
