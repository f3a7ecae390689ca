"""Does libllama's grammar sampler accept a text? (Feeds its tokens one by one.)"""

from __future__ import annotations

import ctypes
import math

import llama_cpp

from kvswap.backend.grammar import new_grammar_sampler
from kvswap.backend.vocab import Vocab


def _allows(smpl: object, token: int) -> bool:
    one = llama_cpp.llama_token_data(token, 1.0, 0.0)
    arr = llama_cpp.llama_token_data_array(
        data=ctypes.pointer(one), size=1, selected=-1, sorted=False
    )
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
    return math.isfinite(one.logit)


def grammar_accepts(vocab: Vocab, gbnf: str, text: str) -> bool:
    """True when the grammar admits `text` as a complete output (EOS allowed after it)."""
    smpl = new_grammar_sampler(vocab, gbnf)
    try:
        for tok in vocab.tokenize(text, add_special=False, parse_special=False):
            if not _allows(smpl, int(tok)):
                return False
            llama_cpp.llama_sampler_accept(smpl, int(tok))
        return _allows(smpl, vocab.eos)
    finally:
        llama_cpp.llama_sampler_free(smpl)
