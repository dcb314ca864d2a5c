"""Lightning's example programs (``examples/pytorch/`` of a Lightning checkout) under Lightning and here.

    python bench/lightning_examples.py PATH_TO_LIGHTNING_CHECKOUT [--only NAME ...] [--out DIR]
        [--pythonpath DIR ...] [--timeout S]

Not run by CI: Lightning's programs are not part of this repository. Each program is read from the
checkout, copied to a temporary folder (as it is for Lightning's run; with its import lines rewritten to
``trainer.lightning`` for this trainer's: bench/_lightning_example_harness.py), given small local files in
place of its downloads, and run through its own command line with small sizes
(bench/_lightning_example_runner.py records each training batch's loss). Per program:

1. under Lightning, one process: the programs that fail here on a CPU are listed with their error and not
   counted;
2. here, one process, the same command line: per-step losses against Lightning's (rel ``1e-5``) where the
   program holds the data order equal (no shuffled loader: Lightning's shuffle draws from the global
   generator, this trainer's from its seed and the epoch);
3. here, one process accumulating 2 batches per step, then DDP 2 and FSDP 2: per-step losses against that
   one process (rel ``1e-5``) where every rank draws the same random numbers (no dropout, no per-step noise).

The results go to ``OUT/lightning_examples.json`` and ``.md`` (default bench/results/lightning/; the rows of programs
not run this time are kept), and with ``--docs`` into docs/lightning-examples.md's table. ``--pythonpath`` adds folders to the programs' import path (a
``torchvision`` built for the installed torch, for the programs that need it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import _lightning_example_harness as harness  # noqa: E402

RTOL = 1e-5
TINY_CLI = ["--data.batch_size=4", "--trainer.max_epochs=1", "--trainer.limit_train_batches=4",
            "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2", "--trainer.limit_predict_batches=2",
            "--trainer.accelerator=cpu", "--trainer.log_every_n_steps=1"]


def _mnist(mode_root: str, cwd: str) -> None:
    """The demos' MNIST files, random, where the basics programs read them (``<examples>/Datasets``):
    60,000 training images, as their hard-coded 55,000 / 5,000 split needs."""
    import torch

    generator = torch.Generator().manual_seed(11)
    folder = os.path.join(mode_root, "Datasets", "MNIST", "complete")
    os.makedirs(folder, exist_ok=True)
    for name, count in (("training.pt", 60000), ("test.pt", 64)):
        images = torch.randint(0, 256, (count, 28, 28), dtype=torch.uint8, generator=generator)
        torch.save((images, torch.randint(0, 10, (count,), generator=generator)), os.path.join(folder, name))


def _wikitext(mode_root: str, cwd: str) -> None:
    """``./data/wikitext-2.txt`` of 37 words: 4,040 blocks of 35 tokens (the program's split keeps
    2,000 + 2,000 for validation and test, 40 for training)."""
    import torch

    generator = torch.Generator().manual_seed(11)
    os.makedirs(os.path.join(cwd, "data"), exist_ok=True)
    words = [f"w{i}" for i in range(36)]
    with open(os.path.join(cwd, "data", "wikitext-2.txt"), "w", encoding="utf-8") as f:
        for _ in range(4041 * 35 // 12 + 1):
            f.write(" ".join(words[i] for i in torch.randint(0, 36, (11,), generator=generator).tolist()) + "\n")


def _images(folder: str, count: int, size: tuple[int, int], mode: str, seed: int) -> None:
    import torch
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    os.makedirs(folder, exist_ok=True)
    channels = 3 if mode == "RGB" else 1
    for index in range(count):
        pixels = torch.randint(0, 256, (size[1], size[0], channels), dtype=torch.uint8, generator=generator)
        Image.fromarray(pixels.squeeze(-1).numpy(), mode).save(os.path.join(folder, f"{index}.png"))


def _kitti(mode_root: str, cwd: str) -> None:
    """``./kitti/training/{image_2,semantic}/``: 4 images and masks, all for training (the program's 80/20
    split keeps ``4 // 5`` for validation)."""
    _images(os.path.join(cwd, "kitti", "training", "image_2"), 4, (64, 32), "RGB", 1)
    _images(os.path.join(cwd, "kitti", "training", "semantic"), 4, (64, 32), "L", 2)


def _image_folder(mode_root: str, cwd: str) -> None:
    """``./imagenet/{train,val}/<class>/``: 2 classes of 2 small images each."""
    for split, seed in (("train", 3), ("val", 4)):
        for label in ("c0", "c1"):
            _images(os.path.join(cwd, "imagenet", split, label), 2, (32, 32), "RGB", seed + len(label))


#: program -> how it is run: its arguments, its stand-in data, how 2 ranks are asked for (its own command
#: line, or Trainer defaults for a program without one), and why a comparison cannot hold where it cannot
EXAMPLES = {
    "bug_report/bug_report_model.py": dict(args=[], data=None, cli=False),
    "basics/transformer.py": dict(
        # (it sets max_epochs=20 itself and fixes its 2,000-sample validation and test splits: the runner's
        # Trainer defaults limit what it leaves unset, as Lightning's PL_TRAINER_* variables would)
        args=[], data=_wikitext, cli=False, defaults={"limit_val_batches": 2, "limit_test_batches": 2},
        lightning_order="its training loader shuffles (Lightning: the global generator; here: the seed and epoch)",
        ranks_order="dropout: each rank draws its own masks"),
    "basics/autoencoder.py": dict(args=TINY_CLI, data=_mnist, cli=True),
    "basics/backbone_image_classifier.py": dict(args=TINY_CLI, data=_mnist, cli=True),
    "basics/profiler_example.py": dict(args=["--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                                             "--trainer.limit_val_batches=2", "--trainer.accelerator=cpu"],
                                       data=None, cli=True),
    "domain_templates/generative_adversarial_net.py": dict(args=[], data=_mnist, cli=False),
    "domain_templates/imagenet.py": dict(
        args=["fit", "--model.data_path=imagenet", "--model.batch_size=2", "--model.workers=0",
              "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--trainer.accelerator=cpu", "--trainer.log_every_n_steps=1"], data=_image_folder, cli=True,
        lightning_order="its training loader shuffles and its crops are random",
        ranks_order="it divides its batch size by trainer.strategy.num_processes (2 ranks train half the global "
                    "batch of the one-process reference) and each rank draws its own random crops"),
    "domain_templates/computer_vision_fine_tuning.py": dict(args=["fit", "--trainer.max_epochs=1",
                                                                  "--trainer.limit_train_batches=2"],
                                                            data=None, cli=True),
    "domain_templates/semantic_segmentation.py": dict(
        # (its --features_start flag is typed float, which its layers refuse: left at its default)
        args=["--data_path=kitti", "--batch_size=2", "--num_layers=2"], data=_kitti, cli=False,
        defaults={"max_epochs": 1},
        lightning_order="its training loader shuffles (Lightning: the global generator; here: the seed and epoch)"),
    "domain_templates/reinforce_learn_Qnet.py": dict(args=["--max_episode_reward=1"], data=None, cli=False),
    "domain_templates/reinforce_learn_ppo.py": dict(args=["--epoch_len=8"], data=None, cli=False),
    "servable_module/production.py": dict(args=["--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                                                "--trainer.accelerator=cpu"], data=None, cli=True),
    "tensor_parallel/train.py": dict(args=[], data=None, cli=False),
    "fp8_distributed_transformer/train.py": dict(args=[], data=None, cli=False),
}

#: one process accumulating 2 batches (the reference), then the 2-rank strategies
LAYOUTS = {"single_acc2": dict(devices=1, accumulate=2), "ddp": dict(devices=2, strategy="ddp"),
           "fsdp": dict(devices=2, strategy="fsdp")}


def _layout_arguments(spec: dict, layout: dict) -> tuple[list[str], dict]:
    """The extra command-line flags (a LightningCLI program) or Trainer defaults (any other) of a layout."""
    if spec["cli"]:
        flags = [f"--trainer.devices={layout['devices']}"]
        if "strategy" in layout:
            flags.append(f"--trainer.strategy={layout['strategy']}")
        if "accumulate" in layout:
            flags.append(f"--trainer.accumulate_grad_batches={layout['accumulate']}")
        return flags, {}
    defaults = {"devices": layout["devices"]}
    if "strategy" in layout:
        defaults["strategy"] = layout["strategy"]
    if "accumulate" in layout:
        defaults["accumulate_grad_batches"] = layout["accumulate"]
    return [], defaults


def run_example(name: str, spec: dict, examples_dir: str, work: str, pythonpath: list[str], timeout: float) -> dict:
    """Every run of one program; its row of the results."""
    row: dict = {"program": name}
    runs: dict[str, harness.Run] = {}

    def one(label: str, mode: str, extra_args: list[str] = (), defaults: dict | None = None) -> harness.Run:
        mode_root = os.path.join(work, mode)
        cwd = os.path.join(work, "cwd", name.replace("/", "_"), label)
        os.makedirs(cwd, exist_ok=True)
        if spec["data"] is not None:
            spec["data"](mode_root, cwd)
        started = time.perf_counter()
        result = harness.run(mode, os.path.join(mode_root, "pytorch", name), [*spec["args"], *extra_args],
                             os.path.join(work, "out", name.replace("/", "_"), label), cwd, defaults,
                             env={"PL_USE_MOCKED_MNIST": "1"},
                             pythonpath=[*pythonpath, os.path.join(mode_root, "pytorch")], timeout=timeout)
        row.setdefault("seconds", {})[label] = round(time.perf_counter() - started, 1)
        runs[label] = result
        return result

    lightning = one("lightning", "lightning", defaults=spec.get("defaults"))
    row["lightning_cpu"] = lightning.error is None
    if lightning.error is not None:
        row["lightning_error"] = lightning.error
        return row
    mirror = one("here", "mirror", defaults=spec.get("defaults"))
    row["runs_here"] = mirror.error is None
    if mirror.error is not None:
        row["error_here"] = mirror.error
        return row
    reference = harness.step_losses(lightning.records)
    equal, worst = harness.compare(harness.step_losses(mirror.records), reference, RTOL)
    row["steps"] = len(reference)
    row["vs_lightning"] = {"equal": equal, "max_rel": worst, "order_held": "lightning_order" not in spec,
                           "note": spec.get("lightning_order", "")}
    single = None
    for label, layout in LAYOUTS.items():
        extra, defaults = _layout_arguments(spec, layout)
        defaults = {**spec.get("defaults", {}), **defaults}
        result = one(label, "mirror", extra, defaults)
        if result.error is not None:
            row[label] = {"runs": False, "error": result.error, **_steps_before(result, layout, single)}
            continue
        losses = harness.step_losses(result.records, layout.get("accumulate", 1))
        if single is None:
            single = losses
            row[label] = {"runs": True, "steps": len(losses)}
            continue
        equal, worst = harness.compare(losses, single, RTOL)
        row[label] = {"runs": True, "equal": equal, "max_rel": worst, "order_held": "ranks_order" not in spec,
                      "note": spec.get("ranks_order", "")}
    return row


def _steps_before(result: harness.Run, layout: dict, single: list[float] | None) -> dict:
    """For a run that failed after training some steps: those steps against the one-process reference's."""
    if not result.records or single is None:
        return {}
    try:
        losses = harness.step_losses(result.records, layout.get("accumulate", 1))
    except ValueError:  # the ranks stopped at different batches
        return {}
    equal, worst = harness.compare(losses, single[:len(losses)], RTOL)
    return {"steps_before": len(losses), "equal_before": equal, "max_rel_before": worst}


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, dict):
        if not value.get("runs", True):
            before = ""
            if "steps_before" in value:
                verdict = "equal" if value["equal_before"] else "differs"
                before = (f" after {value['steps_before']} training steps ({verdict} to one process's, max rel "
                          f"{value['max_rel_before']:.1e})")
            return f"fails{before}: {_short(value['error'], 160)}"
        if "equal" not in value:
            return f"runs ({value.get('steps')} steps)"
        verdict = "equal" if value["equal"] else ("differs" if value["order_held"] else "not comparable")
        note = f" ({value['note']})" if value.get("note") else ""
        return f"{verdict}, max rel {value['max_rel']:.1e}{note}"
    return str(value)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def markdown(rows: list[dict], header: str) -> str:
    lines = [header, "", "| program | under Lightning on a CPU | here | per-step losses vs Lightning | "
             "DDP 2 vs one process | FSDP 2 vs one process |", "|---|---|---|---|---|---|"]
    for row in rows:
        if not row["lightning_cpu"] and row["lightning_error"].startswith("TimeoutError"):
            lines.append(f"| `{row['program']}` | not known: {row['lightning_error'][14:]} (give a longer --timeout) "
                         "| not run | | | |")
            continue
        if not row["lightning_cpu"]:
            lines.append(f"| `{row['program']}` | no: {_short(row['lightning_error'])} | not counted | | | |")
            continue
        here = "yes" if row.get("runs_here") else f"no: {_short(row.get('error_here', ''))}"
        lines.append(f"| `{row['program']}` | yes | {here} | {_cell(row.get('vs_lightning'))} | "
                     f"{_cell(row.get('ddp'))} | {_cell(row.get('fsdp'))} |")
    return "\n".join(lines) + "\n"


def write_docs_table(table: str, page: str = os.path.join(os.path.dirname(HERE), "docs", "lightning-examples.md")) -> None:
    """The results table into ``page``, between its ``lightning-examples`` markers."""
    begin, end = "<!-- lightning-examples begin -->", "<!-- lightning-examples end -->"
    with open(page, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(begin, 1)
    with open(page, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n{table}{end}{rest.split(end, 1)[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", help="a clone of Lightning's repository (its examples/pytorch/ is read)")
    parser.add_argument("--only", nargs="*", default=None, help="programs to run (paths under examples/pytorch/)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "lightning"))
    parser.add_argument("--pythonpath", nargs="*", default=[], help="folders added to the programs' import path")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for one run of one program")
    parser.add_argument("--docs", action="store_true", help="also write the table into docs/lightning-examples.md")
    args = parser.parse_args()
    examples_dir = os.path.join(args.checkout, "examples", "pytorch")
    if not os.path.isdir(examples_dir):
        parser.error(f"checkout={args.checkout!r} has no examples/pytorch/: give the root of Lightning's repository")
    names = args.only or list(EXAMPLES)
    unknown = [name for name in names if name not in EXAMPLES]
    if unknown:
        parser.error(f"--only {unknown}: not among {list(EXAMPLES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lightning_examples_") as work:
        harness.copy_unchanged(examples_dir, os.path.join(work, "lightning", "pytorch"))
        harness.port(examples_dir, os.path.join(work, "mirror", "pytorch"))
        for name in names:
            print(f"== {name}", flush=True)
            rows.append(run_example(name, EXAMPLES[name], examples_dir, work, args.pythonpath, args.timeout))
            print(json.dumps(rows[-1], default=str), flush=True)
    import lightning
    import torch

    header = (f"Lightning {lightning.__version__}, torch {torch.__version__}, {platform.platform()}, "
              f"{time.strftime('%Y-%m-%d')}; rel tolerance {RTOL:g}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "lightning_examples.json")
    if os.path.exists(path):  # the rows of programs not run this time are kept
        with open(path) as f:
            kept = {row["program"]: row for row in json.load(f)["rows"]}
        kept.update({row["program"]: row for row in rows})
        rows = [kept[name] for name in EXAMPLES if name in kept]
    with open(path, "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1, default=str)
    with open(os.path.join(args.out, "lightning_examples.md"), "w") as f:
        f.write(markdown(rows, header))
    if args.docs:
        write_docs_table(markdown(rows, header))
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
