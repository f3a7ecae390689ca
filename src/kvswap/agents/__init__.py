"""The real coding agents' clients (Claude Code, Codex) and a recording proxy, for tests and
benchmarks that drive kvswap as those agents do."""
