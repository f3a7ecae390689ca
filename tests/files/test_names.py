"""File and page name rules: llama-server's fs_validate_filename plus kvswap's reservations."""

from __future__ import annotations

import pytest

from kvswap.files import InvalidNameError, validate_filename, validate_page_name

pytestmark = pytest.mark.timeout(10)

GOOD = ["slot.bin", "a", "mind-42", "ünïcødé", "日本語.bin", "a.b.c", ".hidden", "x" * 250, "a b"]
BAD = [
    "",
    ".",
    "..",
    "../x",
    "a/../b",
    "a..b",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "a\0b",
    "a\nb",
    "a\x7fb",
    "a\x85b",  # C1 control
    " lead",
    "trail ",
    "dot.",
    "a:b",
    "a*b",
    "a?b",
    'a"b',
    "a<b",
    "a>b",
    "a|b",
    "a\uff0eb",
    "a\u2215b",
    "a\u2216b",
    "a\ufffdb",
    "a\ufeffb",
    "a\ud800b",  # a lone surrogate, as a JSON "\ud800" escape decodes
    "x" * 251,  # F + ".ckpt" must fit one directory entry
    "é" * 126,  # 252 bytes
    ".kvswap",
    ".KVSWAP",
    ".kvswap-x",
    "mind.ckpt",
    "mind.dft",
    "mind.lora",
    "mind.CKPT",
]


@pytest.mark.parametrize("name", GOOD)
def test_good_filenames(name: str) -> None:
    assert validate_filename(name) == name


@pytest.mark.parametrize("name", BAD)
def test_bad_filenames(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_filename(name)
    assert info.value.http_status == 400 and info.value.kind == "invalid"


@pytest.mark.parametrize("name", ["p", "agent", "x" * 255, "with space ", "名前", "a.b"])
def test_good_page_names(name: str) -> None:
    assert validate_page_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "a/b", "a\\b", "..", "a..b", "a\0", "a\x1f", "x" * 256, "\ud800"]
)
def test_bad_page_names(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_page_name(name)
