"""Reliability tests start their own `kvswap serve` subprocesses with the server tests' factory."""

from tests.server.conftest import server_factory, start

__all__ = ["server_factory", "start"]
