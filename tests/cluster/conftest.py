"""Fixtures of the cluster tests: one real redis-server per session, emptied per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from kvswap.tiers.shared.store import SharedStore
from tests.cluster.util import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer.start(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture()
def rclient(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def make_store(rclient: redis.Redis) -> Iterator[Callable[..., SharedStore]]:
    stores: list[SharedStore] = []

    def make(replica_id: str = "r1", **kwargs: object) -> SharedStore:
        store = SharedStore(rclient, replica_id=replica_id, **kwargs)  # type: ignore[arg-type]
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()
