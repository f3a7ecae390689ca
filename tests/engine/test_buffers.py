"""The buffer worker: a buffer it hands out is as fresh as a new mapping, reused or not.

A mind switch frees a page and asks for the next spare; the worker may hand the freed mapping
out again, so a page never carries another mind's bytes."""

from __future__ import annotations

import queue

import pytest

from kvswap.engine.kv.buffers import BufferReady, BufferWorker

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


def _allocate(worker: BufferWorker, answers: queue.SimpleQueue[BufferReady], n: int) -> BufferReady:
    worker.allocate(n, tag=n)
    ready = answers.get(timeout=30)
    assert ready.tag == n and ready.buffer is not None, ready
    return ready


def test_a_freed_buffer_comes_back_zeroed_and_no_larger_than_twice_the_ask() -> None:
    answers: queue.SimpleQueue[BufferReady] = queue.SimpleQueue()
    worker = BufferWorker(answers.put)
    try:
        first = _allocate(worker, answers, 8 * MiB).buffer
        assert first is not None
        first[:] = b"\xab" * len(first)  # a mind's bytes
        freed: queue.SimpleQueue[None] = queue.SimpleQueue()
        worker.dispose(first, lambda: freed.put(None))
        freed.get(timeout=30)
        for n in (6 * MiB, 3 * MiB):  # the first fits (reused or not), the second never may
            again = _allocate(worker, answers, n).buffer
            assert again is not None
            assert n <= len(again) <= 2 * n
            assert again[:] == bytes(len(again))  # nothing of the old page, tail included
            worker.dispose(again, lambda: freed.put(None))
            freed.get(timeout=30)
    finally:
        worker.close()
