"""A trained Hugging Face module exported as a directory ``from_pretrained`` reads: ``config.json``,
safetensors weights and the tokenizer files of the directory it came from.

At the end of a run: ``HFCausalLM(..., export_dir=OUT)`` (``module.export_dir=OUT``). From any
checkpoint, full or sharded, of any layout::

    trainer consolidate CKPT OUT --format hf --model MODEL_DIR

(``MODEL_DIR``: the directory the run started from, for its config and tokenizer.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any

import torch

from trainer.hf import source

WRAPPER_PREFIX = "model."  # HFModule holds the transformers model as self.model


def export_pretrained(weights: dict[str, torch.Tensor], config: Any, out: str, auto_class: str = "AutoModelForCausalLM",
                      tokenizer_dir: str | None = None, max_shard_size: str | int = "5GB") -> str:
    """Write ``weights`` (full tensors, named as the HFModule's state dict: ``model.`` + the
    transformers names) with ``config`` to ``out`` in transformers' layout; copy the tokenizer
    files of ``tokenizer_dir``. Returns ``out``."""
    names = {name[len(WRAPPER_PREFIX):] if name.startswith(WRAPPER_PREFIX) else name: tensor
             for name, tensor in weights.items()}
    model = source.model_class(config, auto_class)(config)
    missing, unexpected = model.load_state_dict(names, strict=False)
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {
        name for name, _ in model.named_parameters()}
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(f"the weights do not fit {type(model).__name__}: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}; export with the config the run trained")
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    for path in source.tokenizer_files(tokenizer_dir):
        shutil.copy2(path, os.path.join(out, os.path.basename(path)))
    return out


def main(argv: list[str], prog: str = "trainer consolidate") -> int:
    """``trainer consolidate CKPT OUT --format hf --model DIR [--task causal-lm|sequence-classification]``."""
    parser = argparse.ArgumentParser(prog=prog, description="a checkpoint's weights as a Hugging Face directory")
    parser.add_argument("path", help="a checkpoint directory, or a directory of checkpoints (the latest is used)")
    parser.add_argument("out", help="the directory to write (config.json, model.safetensors, tokenizer files)")
    parser.add_argument("--format", choices=["hf"], required=True)
    parser.add_argument("--model", required=True, help="the model directory the run started from (config, tokenizer)")
    parser.add_argument("--task", choices=sorted(TASKS), default="causal-lm")
    args = parser.parse_args(argv)

    from trainer.checkpoint import CheckpointError
    from trainer.checkpoint.consolidate import full_weights

    try:
        config = source.load_config(args.model, None)
        weights = full_weights(args.path)
        export_pretrained(weights, config, args.out, TASKS[args.task], tokenizer_dir=args.model)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote a Hugging Face model directory ({len(weights)} tensors) to {args.out}")
    return 0


TASKS = {"causal-lm": "AutoModelForCausalLM", "sequence-classification": "AutoModelForSequenceClassification"}
