"""kvswap: a llama-server-compatible inference server with paged conversation state."""

__version__ = "0.1.0"
