"""parse_size / format_size: the size syntax of kvswap's byte flags."""

from __future__ import annotations

import pytest

from kvswap.config import ConfigError, format_size, parse_size

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [
        ("0", 0),
        ("1048576", MIB),
        ("  4096 ", 4096),
        ("1k", KIB),
        ("1K", KIB),
        ("1KiB", KIB),
        ("1kib", KIB),
        ("512M", 512 * MIB),
        ("512m", 512 * MIB),
        ("512MiB", 512 * MIB),
        ("8G", 8 * GIB),
        ("8 GiB", 8 * GIB),
        ("1.5G", 3 * GIB // 2),
        ("2T", 2 * TIB),
        ("20e9", 20_000_000_000),
        ("1.5e9", 1_500_000_000),
        ("2E3", 2000),
        ("1e3k", 1000 * KIB),
        (".5k", 512),
        ("9007199254740993", 9007199254740993),  # exact past float precision
        ("0.3k", 307),  # rounded down to whole bytes
    ],
)
def test_parse_size_accepts(text: str, n_bytes: int) -> None:
    assert parse_size(text, "--page-ram-bytes") == n_bytes


@pytest.mark.parametrize(
    "text",
    ["", " ", "abc", "G", "1X", "1 2", "1e", "1..2", "0x10", "inf", "nan", "1GiBs", "8GB!"],
)
def test_parse_size_rejects_junk_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--page-ram-bytes") as err:
        parse_size(text, "--page-ram-bytes")
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("text", ["-1", "-1G", " -5", "-0.5k"])
def test_parse_size_rejects_negative(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--max-body-bytes: size must not be negative"):
        parse_size(text, "--max-body-bytes")


@pytest.mark.parametrize("text", ["1KB", "1kb", "2MB", "8GB", "1 TB"])
def test_parse_size_refuses_ambiguous_decimal_units(text: str) -> None:
    with pytest.raises(ConfigError, match="ambiguous unit"):
        parse_size(text, "--page-disk-bytes")


def test_parse_size_rejects_values_past_int64() -> None:
    with pytest.raises(ConfigError, match="too large"):
        parse_size("1e30", "--page-disk-bytes")
    assert parse_size(str((1 << 63) - 1), "--page-disk-bytes") == (1 << 63) - 1


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [(0, "0"), (100, "100"), (KIB, "1k"), (1536 * MIB, "1536M"), (8 * GIB, "8G"), (TIB, "1T")],
)
def test_format_size_round_trips(n_bytes: int, text: str) -> None:
    assert format_size(n_bytes) == text
    assert parse_size(text, "--x") == n_bytes
