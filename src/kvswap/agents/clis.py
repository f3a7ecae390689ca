"""The real coding agents' command-line clients, pointed at a server: Claude Code and Codex.

`scripts/setup.sh` installs both from npm at the versions pinned here into
`<cache>/agents/` (each package carries its own binary). `ClaudeCode` and `Codex` run one turn
each (`turn`: a new session; `next_turn`: the client's own continuation of its last session:
`claude -p --continue`, `codex exec resume --last`) in a scratch home of their own, offline, and
return the exit status, output and wall time. `agents.drive` runs sessions of them for
`kvswap bench coding` and the tests that run the real clients.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kvswap.tiny.cache import cache_root

CLAUDE_CODE_VERSION = "2.1.328"
CODEX_VERSION = "0.169.0"
# The model names the clients ask for: any name works (kvswap serves the model it loaded).
CLAUDE_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = "gpt-5-codex"


def agents_dir() -> Path:
    return cache_root() / "agents"


def binary(name: str) -> Path:
    """`claude` or `codex` as setup installed it; FileNotFoundError naming setup otherwise."""
    path = agents_dir() / "node_modules" / ".bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run scripts/setup.sh (it installs {name})")
    return path


@dataclass
class Ran:
    """One run of a client."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def __str__(self) -> str:
        return (
            f"{' '.join(self.argv[1:])}: exit {self.returncode} after {self.wall_s:.1f} s\n"
            f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"
        )


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> Ran:
    start = time.monotonic()
    done = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,  # `codex exec` reads a prompt from a piped stdin
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Ran(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def _quiet_env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
    return {**keep, "HOME": str(home), "NO_COLOR": "1"}


@dataclass
class ClaudeCode:
    """`claude -p` against `base_url` (kvswap's /v1/messages), with API key `api_key`.

    `max_output_tokens` caps each answer (`CLAUDE_CODE_MAX_OUTPUT_TOKENS`; the client asks for
    32000 otherwise, and a random-weight model runs to the end of its context); `tools` names
    the built-in tools it offers the model (`--tools`; "default" is its whole set)."""

    base_url: str
    home: Path
    api_key: str = "none"
    max_output_tokens: int = 300
    tools: str = "default"

    def env(self) -> dict[str, str]:
        return {
            **_quiet_env(self.home),
            "ANTHROPIC_BASE_URL": self.base_url,
            "ANTHROPIC_API_KEY": self.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output_tokens),
        }

    def _argv(self, *words: str) -> list[str]:
        return [str(binary("claude")), "-p", *words, "--model", CLAUDE_MODEL, "--tools", self.tools]

    def turn(self, prompt: str, timeout_s: float = 900) -> Ran:
        self.home.mkdir(parents=True, exist_ok=True)
        return _run(self._argv(prompt), self.env(), self.home, timeout_s)

    def next_turn(self, prompt: str, timeout_s: float = 900) -> Ran:
        return _run(self._argv("--continue", prompt), self.env(), self.home, timeout_s)

    def resume(self, session: str, prompt: str, timeout_s: float = 900) -> Ran:
        """`claude -p --resume SESSION PROMPT`: that session, whatever ran since."""
        return _run(self._argv("--resume", session, prompt), self.env(), self.home, timeout_s)


@dataclass
class Codex:
    """`codex exec` against `base_url` (kvswap's /v1, the Responses API), key `api_key`."""

    base_url: str
    home: Path
    api_key: str = "none"

    def env(self) -> dict[str, str]:
        return {
            **_quiet_env(self.home),
            "CODEX_HOME": str(self.home),
            "KVSWAP_API_KEY": self.api_key,
        }

    def _configure(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'model = "{CODEX_MODEL}"\n'
            'model_provider = "kvswap"\n'
            "[model_providers.kvswap]\n"
            'name = "kvswap"\n'
            f'base_url = "{self.base_url}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "KVSWAP_API_KEY"\n'
        )

    def _argv(self, *words: str) -> list[str]:
        return [str(binary("codex")), "exec", *words]

    def turn(self, prompt: str, timeout_s: float = 900) -> Ran:
        self._configure()
        return _run(self._argv("--skip-git-repo-check", prompt), self.env(), self.home, timeout_s)

    def next_turn(self, prompt: str, timeout_s: float = 900) -> Ran:
        argv = self._argv("resume", "--last", "--skip-git-repo-check", prompt)
        return _run(argv, self.env(), self.home, timeout_s)
