"""llama-server's router-mode flags fail at start-up with one line naming the flag."""

from __future__ import annotations

import pytest

from kvswap.config import ConfigError, MachineInfo, parse_serve_args

HOST = MachineInfo(physical_ram_bytes=16 << 30, n_cpu_physical=4, n_cpu_logical=8)


@pytest.mark.parametrize(
    "argv",
    [
        ["--models-dir", "m"],
        ["--models-preset", "p.ini"],
        ["--models-max", "2"],
        ["--no-models-autoload"],
    ],
)
def test_router_flags_are_refused_naming_the_flag(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_serve_args(argv, {}, machine=HOST)
    assert f'argument "{argv[0]}"' in str(err.value)
    assert "router mode" in str(err.value) and "-m MODEL" in str(err.value)


def test_a_router_environment_variable_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="LLAMA_ARG_MODELS_DIR"):
        parse_serve_args([], {"LLAMA_ARG_MODELS_DIR": "/models"}, machine=HOST)
