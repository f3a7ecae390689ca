"""`kvswap make-tiny-model`: write one tiny random-weight GGUF and say what was written.

Owns the argument parser and `main(argv) -> int` (argv without the program and subcommand
names); the `kvswap` console script dispatches here. Only argument handling and printing: the
model itself comes from writer.py. Modes: the default writes a base model (`--arch`);
`--lora --base PATH` writes a random LoRA adapter for that base (lora.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvswap.tiny.archs import ARCHS
from kvswap.tiny.lora import write_tiny_lora
from kvswap.tiny.params import DTYPES, VOCABS, TinyModelError, TinyParams
from kvswap.tiny.presets import KV_PRESETS, realistic_kv_params
from kvswap.tiny.writer import WrittenModel, write_tiny_gguf

# Flags whose default is "not given" (None), so a --kv-like preset can fill them.
_GEOMETRY_FLAGS = ("n_layer", "n_head", "n_head_kv", "head_dim", "n_embd", "n_ff", "n_ctx_train")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvswap make-tiny-model",
        description="Write a tiny random-weight GGUF model for tests, drafts and benchmarks.",
    )
    p.add_argument("--arch", choices=sorted(ARCHS), help="architecture (required for a model)")
    p.add_argument("--out", required=True, type=Path, help="GGUF file to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-embd", type=int, help="embedding width (default 64)")
    p.add_argument("--n-layer", type=int, help="layers (default: 2, hybrids 3, qwen35 4)")
    p.add_argument("--n-ctx-train", type=int, help="training context (default 4096)")
    p.add_argument("--n-head", type=int, help="attention heads (default 4)")
    p.add_argument("--n-head-kv", type=int, help="KV heads (default 2)")
    p.add_argument("--head-dim", type=int, help="attention head width (default n_embd/n_head)")
    p.add_argument("--n-ff", type=int, help="feed-forward width (default 2*n_embd)")
    p.add_argument("--vocab", choices=VOCABS, default="tiny")
    p.add_argument("--dtype", choices=DTYPES, default="f32")
    p.add_argument(
        "--clean-text",
        action="store_true",
        help="never emit control tokens, lone bytes or partial UTF-8",
    )
    p.add_argument(
        "--kv-like",
        choices=sorted(KV_PRESETS),
        help="llama only: match this model's KV bytes per token with tiny weights "
        "(explicit geometry flags still win)",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="write a LoRA adapter GGUF for the model given by --base instead of a model",
    )
    p.add_argument("--base", type=Path, help="--lora: the base model GGUF")
    p.add_argument("--lora-rank", type=int, default=4, help="--lora: the adapter's rank")
    return p


def params_from_args(args: argparse.Namespace) -> TinyParams:
    geometry: dict[str, int] = {}
    if args.kv_like is not None:
        if args.arch != "llama":
            raise TinyModelError("--kv-like: only with --arch llama")
        geometry.update(realistic_kv_params(args.kv_like))
    for name in _GEOMETRY_FLAGS:
        value = getattr(args, name)
        if value is not None:
            geometry[name] = value
    return TinyParams(
        arch=args.arch,
        seed=args.seed,
        vocab=args.vocab,
        dtype=args.dtype,
        clean_text=args.clean_text,
        **geometry,
    )


def describe(written: WrittenModel) -> str:
    g = written.geometry
    kv = (
        f"{written.kv_bytes_per_token:,} B/token KV at f16"
        if written.kv_bytes_per_token
        else "no KV"
    )
    return (
        f"wrote {written.path}: arch {g.arch}, {written.n_bytes:,} bytes, "
        f"{written.n_tensors} tensors, {g.dtype}, vocab {g.vocab} ({written.n_vocab} tokens), "
        f"{kv}\n"
        f"  seed {g.seed} n_embd {g.n_embd} n_layer {g.n_layer} n_head {g.n_head} "
        f"n_head_kv {g.n_head_kv} head_dim {g.head_dim} n_ff {g.n_ff} "
        f"n_ctx_train {g.n_ctx_train} clean_text {g.clean_text}"
    )


def _make_model(args: argparse.Namespace) -> int:
    params = params_from_args(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    written = write_tiny_gguf(args.out, params)
    print(describe(written))
    return 0


def _make_lora(args: argparse.Namespace) -> int:
    if args.base is None:
        raise TinyModelError("--lora: give the base model with --base PATH")
    if args.arch is not None:
        raise TinyModelError("--lora: the architecture is the base's (drop --arch)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    w = write_tiny_lora(args.base, args.out, seed=args.seed, rank=args.lora_rank)
    print(
        f"wrote {w.path}: LoRA adapter for {w.arch} ({args.base}), {w.n_bytes:,} bytes, "
        f"{w.n_adapted} adapted weights, rank {w.rank}, alpha {w.alpha:g}, seed {args.seed}"
    )
    return 0


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.lora:
            return _make_lora(args)
        if args.arch is None:
            raise TinyModelError("--arch is required (or --lora --base PATH)")
        return _make_model(args)
    except TinyModelError as exc:
        print(f"kvswap make-tiny-model: error: {exc}", file=sys.stderr)
        return 2
