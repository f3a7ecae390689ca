"""The context extension kvswap turns on by itself, and the RoPE setting a page records.

llama-server caps a slot at the model's training context whatever `-c` says, and lifts the cap
only with four flags (`--rope-scaling yarn --rope-scale N --yarn-orig-ctx T --override-kv
ARCH.context_length=int:N*T`). kvswap reads a `-c` that gives a slot more than the training
context as the wish it is: when no `--rope-*`/`--yarn-*` flag is given and the model's metadata
sets no scaling of its own, it extends the context by YaRN at the smallest power-of-two factor
whose window holds what a slot was given (`auto_extension`), and a slot takes that much.
`--rope-scaling none` keeps llama-server's cap.

Only where asked for, because YaRN is not free: on SmolLM2-135M (trained on 8,192 tokens) YaRN
x4 raised the perplexity of 1,024-token windows from 12.70 to 13.42 (+5.6%) and lowered that of
a 12,288-token window from 16.48 to 14.26; at the default `-c` (the training context) nothing
changes.

A state computed under one RoPE setting is another function's state under another, so the
setting is part of what a page, a slot file or a mind file records as its model
(`rope_fingerprint`): a mind saved before a restart that changed the extension is refused as
made by another model, never served with positions it was not computed with. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvswap.config.table_rope import SCALING_TYPES

Rope = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Extension:
    """YaRN by `factor` over a model trained on `n_ctx_orig` tokens."""

    factor: int
    n_ctx_orig: int

    @property
    def n_ctx_train(self) -> int:
        """The training context as extended: what a slot may take."""
        return self.n_ctx_orig * self.factor

    @property
    def rope(self) -> Rope:
        """libllama's context parameters for it, as the llama-server flags would set them."""
        return (
            ("rope_scaling_type", SCALING_TYPES["yarn"]),  # ints where libllama's are
            ("rope_freq_scale", 1.0 / self.factor),
            ("yarn_orig_ctx", self.n_ctx_orig),
        )

    def describe(self, n_ctx_slot: int) -> str:
        """The start-up line saying what was turned on, and how to keep it off."""
        return (
            f"slots of {n_ctx_slot} tokens exceed the model's training context "
            f"({self.n_ctx_orig}): YaRN extends it {self.factor}x to {self.n_ctx_train} "
            f"(as --rope-scaling yarn --rope-scale {self.factor} --yarn-orig-ctx "
            f"{self.n_ctx_orig}); --rope-scaling none keeps slots at {self.n_ctx_orig}"
        )


def yarn_factor(n_tokens: int, n_ctx_train: int) -> int:
    """The smallest power-of-two factor, at least 2, whose extension holds `n_tokens`."""
    factor = 2
    while n_ctx_train * factor < n_tokens:
        factor *= 2
    return factor


def auto_extension(
    *, rope: Rope, n_ctx_slot: int, n_ctx_train: int, model_scaling: str | None
) -> Extension | None:
    """The extension a slot of `n_ctx_slot` tokens (what the flags give it before the training
    context caps it) needs, or None: when it fits the training context, when a RoPE flag was
    given (the user's setting stands, as llama-server's), or when the model's metadata scales
    its RoPE itself (`model_scaling`, its `rope.scaling.type`)."""
    if rope or n_ctx_train <= 0 or n_ctx_slot <= n_ctx_train:
        return None
    if model_scaling not in (None, "", "none"):
        return None
    return Extension(yarn_factor(n_ctx_slot, n_ctx_train), n_ctx_train)


def rope_fingerprint(fingerprint: str, rope: Rope) -> str:
    """The model fingerprint a page made under `rope` records: the model's own when no RoPE
    parameter is set (files written before the setting was recorded keep matching)."""
    if not rope:
        return fingerprint
    fields = ",".join(f"{name}={value:g}" for name, value in sorted(rope))
    return f"{fingerprint};rope={fields}"
