"""llama-server's resumable streams on the CPU (`server.resumable`): any reader gets the same
bytes from any offset, live ones as they come; the 4 MiB buffer drops its oldest bytes and
refuses a read from below them; a stop cancels the producer; one conversation has one live
stream per tenant; a finished stream is forgotten 5 minutes after it ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kvswap.server import resumable
from kvswap.server.resumable import MAX_BYTES, OffsetLost, ResumableStream, ResumableStreams


async def _read(stream: ResumableStream, offset: int = 0) -> bytes:
    return b"".join([chunk async for chunk in stream.read_from(offset)])


async def _produce(chunks: list[bytes], gate: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for i, chunk in enumerate(chunks):
        if gate is not None and i == 1:
            await gate.wait()
        yield chunk


def test_readers_get_the_same_bytes_from_any_offset_live_and_after_the_end() -> None:
    """Defect caught: a reader that attached mid-stream missing or repeating bytes, or a
    reader left waiting after the stream ended."""

    async def main() -> None:
        streams = ResumableStreams()
        gate = asyncio.Event()
        stream = streams.start(("ns", "c1"), _produce([b"data: 1\n\n", b"data: 2\n\n"], gate))
        early = asyncio.ensure_future(_read(stream))
        await asyncio.sleep(0)
        late = asyncio.ensure_future(_read(stream, 3))
        gate.set()
        assert await early == b"data: 1\n\ndata: 2\n\n"
        assert await late == b"a: 1\n\ndata: 2\n\n"
        assert stream.done and await _read(stream, 9) == b"data: 2\n\n"

    asyncio.run(main())


def test_the_buffer_keeps_the_last_4_mib_and_refuses_reads_below_them() -> None:
    stream = ResumableStream("c1")
    stream.append(b"x" * MAX_BYTES)
    stream.append(b"yz")
    stream.end()
    assert stream.n_dropped == 2 and stream.n_bytes == MAX_BYTES + 2

    async def main() -> None:
        with pytest.raises(OffsetLost):
            await _read(stream, 1)
        assert (await _read(stream, MAX_BYTES))[-2:] == b"yz"

    asyncio.run(main())


def test_a_stop_or_a_new_request_cancels_the_producer_and_tenants_are_apart() -> None:
    """Defects caught: DELETE /v1/stream leaving the generation running, two live streams for
    one conversation, and one API key reading or stopping another key's stream."""

    async def main() -> None:
        streams = ResumableStreams()
        never = asyncio.Event()
        first = streams.start(("ka", "c1"), _produce([b"a", b"b"], never))
        other = streams.start(("kb", "c1"), _produce([b"k", b"l"], never))
        await asyncio.sleep(0)
        streams.replace(("ka", "c1"))  # a new request for ka's c1 arrives
        assert first.cancelled and first.done and streams.get(("ka", "c1")) is None
        assert await _read(first) == b"a"
        assert streams.get(("kb", "c1")) is other and not other.done
        assert [s.conversation_id for s in streams.lookup("kb", ["c1"])] == ["c1"]
        assert streams.lookup("ka", ["c1"]) == []
        streams.stop(("kb", "c1"))
        await asyncio.sleep(0)
        assert other.producer is not None and other.producer.cancelled()
        assert streams.get(("kb", "c1")) is None
        streams.stop(("kb", "c1"))  # nothing to stop: no error

    asyncio.run(main())


def test_lookup_matches_an_id_and_its_model_variants_only() -> None:
    async def main() -> None:
        streams = ResumableStreams()
        for conv in ("c1", "c1::org/model", "c10"):
            streams.start(("ns", conv), _produce([b"x"]))
        await asyncio.sleep(0)
        found = sorted(s.conversation_id for s in streams.lookup("ns", ["c1"]))
        assert found == ["c1", "c1::org/model"]

    asyncio.run(main())


def test_a_finished_stream_is_forgotten_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        streams = ResumableStreams()
        stream = streams.start(("ns", "c1"), _produce([b"x"]))
        await asyncio.wait_for(_read(stream), 5)
        assert streams.get(("ns", "c1")) is stream
        now = stream.t_ended_unix_s + resumable.TTL_S + 1
        monkeypatch.setattr(resumable.time, "time", lambda: now)
        assert streams.get(("ns", "c1")) is None

    asyncio.run(main())
