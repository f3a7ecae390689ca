"""Reliability tests start their own `kvswap serve` subprocesses with the server tests' factory."""

from tests.server.conftest import server_factory

__all__ = ["server_factory"]
