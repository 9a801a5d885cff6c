"""`repexp merge`: a verl FSDP checkpoint -> a Hugging Face model directory next to it.

Runs verl's own merger (``python -m verl.model_merger merge --backend fsdp``) in a subprocess, so its
imports and memory stay out of this process, into a temporary directory renamed to
``<checkpoint>/actor/hf`` (the path `repexp select` promises for verl runs; an existing one is reused),
then writes the output pointer JSON. Input: ``--checkpoint-dir <run>/checkpoints/global_step_N`` or
``--pointer select.json`` (from `repexp select`: ``checkpoint_dir`` and ``model_path``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from repexp import layout
from repexp.checkpoints import is_complete
from repexp.io import atomic_path, read_json, write_json_atomic


def merge_checkpoint(checkpoint_dir: str | Path) -> Path:
    """Merge `checkpoint_dir`'s FSDP actor shards into ``actor/hf`` (idempotent, atomic); return that path."""
    checkpoint_dir = Path(checkpoint_dir)
    if layout.checkpoint_step(checkpoint_dir) is None:
        raise ValueError(f"{checkpoint_dir}: not a verl checkpoint directory "
                         f"(expected .../{layout.STEP_PREFIX}<N>)")
    hf_dir = checkpoint_dir.joinpath(*layout.VERL_HF_DIR)
    actor = hf_dir.parent
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"{checkpoint_dir}: checkpoint directory not found")
    if not is_complete(checkpoint_dir):
        raise ValueError(f"{checkpoint_dir}: checkpoint is not marked complete (training died while saving it?)")
    if not (hf_dir / "config.json").exists():
        raise FileNotFoundError(f"{hf_dir / 'config.json'}: missing; not an FSDP actor checkpoint")
    if not any(actor.glob("model_world_size_*_rank_0.pt")):
        raise FileNotFoundError(f"{actor}: no model_world_size_*_rank_0.pt shards")
    target = layout.merged_model_dir(checkpoint_dir)
    if (target / "config.json").exists():
        return target
    with atomic_path(target) as tmp:
        command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                   "--local_dir", str(actor), "--target_dir", str(tmp)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise RuntimeError(f"verl.model_merger failed on {actor} (exit {result.returncode}):\n{tail}")
        if not (tmp / "config.json").exists() or not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"verl.model_merger wrote no Hugging Face model for {actor}")
    return target


def _resolve_inputs(args: argparse.Namespace) -> tuple[Path, dict]:
    if args.checkpoint_dir is not None:
        return Path(args.checkpoint_dir), {}
    pointer = read_json(args.pointer)
    for key in ("checkpoint_dir", "model_path"):
        if key not in pointer:
            raise ValueError(f"{args.pointer}: lacks {key!r} (expected the JSON written by repexp select)")
    checkpoint_dir = Path(pointer["checkpoint_dir"])
    if Path(pointer["model_path"]) != layout.merged_model_dir(checkpoint_dir):
        raise ValueError(f"{args.pointer}: model_path {pointer['model_path']} is not "
                         f"{layout.merged_model_dir(checkpoint_dir)}; is this a verl run?")
    return checkpoint_dir, pointer


def configure_parser(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint-dir", type=Path, help="a verl checkpoint: <run>/checkpoints/global_step_N")
    source.add_argument("--pointer", type=Path, help="model pointer JSON written by repexp select")
    parser.add_argument("--out", required=True, type=Path, help="output model pointer JSON")


def run(args: argparse.Namespace) -> int:
    try:
        checkpoint_dir, pointer = _resolve_inputs(args)
        model_path = merge_checkpoint(checkpoint_dir)
        step = layout.checkpoint_step(checkpoint_dir)  # merge_checkpoint refused a directory without one
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"merge: {err}", file=sys.stderr)
        return 1
    write_json_atomic(args.out, {**pointer, "checkpoint_dir": str(checkpoint_dir), "checkpoint_step": step,
                                 "model_path": str(model_path), "needs_merge": False})
    print(f"merged step {step} into {model_path}", file=sys.stderr)
    return 0
