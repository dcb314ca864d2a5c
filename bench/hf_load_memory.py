"""Peak resident memory of a Hugging Face model's weights going in and out: each rank's peak RSS while
``HFCausalLM(path=DIR)`` loads a saved Llama directory (one process, and FSDP 2 with the model built on
the meta device, each rank reading its own slices), and the peak RSS of ``trainer consolidate --format hf``
writing a checkpoint back out as a ``from_pretrained`` directory.

    python bench/hf_load_memory.py [--layers 12] [--width 512] [--vocab 1024] [--out bench/results/hf_load_memory.json]

The load's figure is the rank's peak RSS from the start of ``configure_model`` to the start of training
(Linux ``VmHWM``, reset at the start through ``/proc/self/clear_refs``), less its RSS at the start: the
weights it holds, the slices it read (file pages of the safetensors files it maps count while mapped) and
any copy on the way. The export's figure is the ``consolidate`` process's own peak RSS (``os.wait4``'s
``ru_maxrss``), whole process (the interpreter, torch and transformers included), beside the RSS of the
same interpreter that only imports them. Sizes in bytes; the model's size is its safetensors' total.

Under FSDP the peak is reached while the meta-device model is materialised (before the files are read):
the rank's own halves, one decoder layer whole, and the root unit's own tensors (the embedding, the final
norm and the head) whole until the root is sharded last. A model whose embedding and head are most of it
(a large vocabulary on a narrow model: ``--layers 4 --vocab 8192``) can then peak above one whole copy;
the default size is shaped as language models are (the layers most of the weights).

Result file (bench/_results.py's format): ``results``: {"model_bytes", "load": {layout: [per rank
{"rss_before", "peak", "peak_increase", "rss_file_after", "param_bytes", "peak_reset"}]}, "export":
{"peak_rss", "baseline_rss"}}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial

import torch

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

#: layout -> (strategy, processes)
LAYOUTS = {"single": ("single", 1), "fsdp2": ("fsdp", 2)}


def save_llama(directory: str, layers: int, width: int, vocab: int) -> int:
    """A random Llama of that size saved with ``save_pretrained`` in 4 shards or more; its bytes."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width * 8 // 3, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(directory, max_shard_size=max(size // 4, 1 << 20))
    return size


def measure_load(directory: str, strategy: str, world: int, out: str) -> list[dict]:
    """Each rank's figures (``_hf_memory_modules.LoadMeasuredLM``) for one step of ``strategy`` on ``world``."""
    from _hf_memory_modules import LoadMeasuredLM
    from trainer import Trainer
    from trainer.strategies import resolve_strategy

    options = {"meta_init": True} if strategy == "fsdp" else {}
    module = LoadMeasuredLM(out, path=directory, optimizer=partial(torch.optim.SGD, lr=1e-3), max_bytes=20_000,
                            block_size=16)
    Trainer(strategy=resolve_strategy(strategy, **options), devices=world, max_steps=1, batch_size=2 * world,
            loggers=[], checkpoint=None, progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            run_dir=os.path.join(out, "run")).fit(module)
    return [read_json(os.path.join(out, f"load_rank{rank}.json")) for rank in range(world)]


#: measure_load in a fresh interpreter (arguments: the bench folder, then measure_load's)
_LOAD_IN_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from hf_load_memory import measure_load; "
                  "measure_load(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])")


def measure_load_fresh(directory: str, strategy: str, world: int, out: str) -> list[dict]:
    """``measure_load`` run from a new interpreter: a long-lived caller (a test session) holds freed memory
    that a load in it would reuse without raising its resident size, hiding a whole copy."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _LOAD_IN_CHILD, BENCH, directory, strategy, str(world), out],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"measure_load({strategy!r}, {world}) failed ({done.returncode}): {done.stderr[-2000:]}")
    return [read_json(os.path.join(out, f"load_rank{rank}.json")) for rank in range(world)]


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


#: runs its arguments' Python code, then prints the process's peak RSS (VmHWM, KiB): an exec'd child's
#: own, where getrusage would report the larger peak of the process it was forked from
_REPORT_PEAK = ("import sys; code = sys.argv.pop(1); exec(code)\n"
                "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")


def child_peak_rss(code: str, *args: str) -> int:
    """Python ``code`` (with ``args`` as ``sys.argv[1:]``) run in a fresh interpreter, failing loudly;
    that process's peak RSS in bytes."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _REPORT_PEAK, code, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{code} {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(done.stdout.strip().splitlines()[-1]) * 1024


def measure_export(directory: str, out: str) -> dict:
    """A full checkpoint of the model trained one step, then ``trainer consolidate --format hf`` of it."""
    from trainer import Trainer
    from trainer.hf import HFCausalLM

    module = HFCausalLM(path=directory, optimizer=partial(torch.optim.SGD, lr=1e-3), max_bytes=20_000, block_size=16)
    Trainer(max_steps=1, batch_size=2, loggers=[], progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, val_every_n_steps=None, run_dir=os.path.join(out, "run")).fit(module)
    consolidate = ("from trainer.cli.command import main; "
                   "assert main(['consolidate', *sys.argv[1:]]) == 0")
    peak = child_peak_rss(consolidate, os.path.join(out, "run", "checkpoints"), os.path.join(out, "exported"),
                          "--format", "hf", "--model", directory)
    baseline = child_peak_rss("import torch, transformers, trainer.hf.export, trainer.cli.command")
    return {"peak_rss": peak, "baseline_rss": baseline}


def run(layers: int, width: int, vocab: int, export: bool = True) -> dict:
    """The figures for one model size (see the module's docstring)."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "model")
        size = save_llama(directory, layers, width, vocab)
        results = {"model_bytes": size, "load": {}}
        for name, (strategy, world) in LAYOUTS.items():
            out = os.path.join(tmp, name)
            os.makedirs(out)
            results["load"][name] = measure_load_fresh(directory, strategy, world, out)
        if export:
            os.makedirs(os.path.join(tmp, "export"))
            results["export"] = measure_export(directory, os.path.join(tmp, "export"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--out", help="the result file (default bench/results/hf_load_memory.json)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from _results import Recorder

    recorder = Recorder("hf_load_memory", {"model": f"Llama {args.layers}x{args.width}, vocab {args.vocab}, fp32",
                                           "load": "peak RSS from configure_model to the first step, per rank",
                                           "export": "trainer consolidate --format hf, whole process"}, args.out)
    results = run(args.layers, args.width, args.vocab)
    mb = 2 ** 20
    print(f"model: {results['model_bytes'] / mb:.1f} MB")
    for name, ranks in results["load"].items():
        for rank, r in enumerate(ranks):
            print(f"load {name:<7} rank {rank}: peak increase {r['peak_increase'] / mb:7.1f} MB  (own parameters "
                  f"{r['param_bytes'] / mb:.1f} MB, RSS before {r['rss_before'] / mb:.0f} MB)")
    export = results["export"]
    print(f"export (consolidate --format hf): peak RSS {export['peak_rss'] / mb:.0f} MB, of which the interpreter "
          f"with torch and transformers imported {export['baseline_rss'] / mb:.0f} MB")
    recorder.write(results)


if __name__ == "__main__":
    main()
