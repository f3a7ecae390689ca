"""Undefined template variables behave as in llama.cpp's jinja engine: a string plus one is the
string (firefunction-v2 adds `functions`, which llama-server never sets); anything else fails."""

from __future__ import annotations

import pytest

from kvswap.text.template import ChatTemplate, TemplateRenderError

MESSAGES = [{"role": "user", "content": "hi"}]


def test_a_string_plus_an_undefined_value_is_the_string() -> None:
    assert ChatTemplate("{{ 'a' + nope + 'b' }}", "", "").render(MESSAGES) == "ab"
    assert ChatTemplate("{% set x = 'p' + nope %}{{ x }}", "", "").render(MESSAGES) == "p"


def test_other_uses_of_an_undefined_value_still_fail() -> None:
    with pytest.raises(TemplateRenderError, match="'nope' is undefined"):
        ChatTemplate("{{ 1 + nope }}", "", "").render(MESSAGES)
    with pytest.raises(TemplateRenderError):
        ChatTemplate("{{ nope.attr + 'x' }}", "", "").render(MESSAGES)
