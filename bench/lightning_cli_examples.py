"""Lightning's own LightningCLI example programs run here with their imports changed, from their own
command line: each under Lightning (the oracle) and, its Lightning imports rewritten to
``trainer.lightning``, under this trainer, one process each; the per-step training losses and the
test metrics compared (rel 1e-5: the data order is the examples' own, unshuffled).

    python bench/lightning_cli_examples.py PATH_TO_LIGHTNING_CHECKOUT [--out results.json]

Not run by CI: Lightning's examples are not copied into this repository; give a checkout of
Lightning's repository (tests/support/lightning_rewrite.py ports the imports). The examples download
MNIST and need torchvision: both are replaced by local stand-ins through import lines only (a
synthetic MNIST of the same sizes, ``ToTensor``, ``make_grid`` / ``save_image`` that write nothing),
the same on both sides. Each example's row in the output says whether it ran on each side, the error
line where it did not, and whether the numbers matched.

Lightning's other LightningCLI examples are not run: ``profiler_example.py`` (torchvision's ResNet and
Lightning's PyTorchProfiler), ``computer_vision_fine_tuning.py`` (a downloaded image set and
BaseFinetuning), ``imagenet.py`` (ImageNet), ``servable_module/production.py`` (a served model).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.support.lightning_rewrite import rewrite_imports  # noqa: E402

#: the examples that build a LightningCLI and run on a CPU with local data
EXAMPLES = ("examples/pytorch/basics/backbone_image_classifier.py", "examples/pytorch/basics/autoencoder.py")
#: short runs: the examples' own arguments, on the command line as a user gives them
ARGS = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2", "--trainer.limit_predict_batches=2", "--trainer.accelerator=cpu",
        "--trainer.logger=false", "--trainer.enable_progress_bar=false",
        "--trainer.callbacks+=cli_recorder.StepRecorder", "--trainer.callbacks.path=record.json")
RTOL = 1e-5

#: import lines replaced by the stand-ins (the data set, torchvision), the same on both sides
STAND_INS = {
    "from lightning.pytorch.demos.mnist_datamodule import MNIST": "from cli_stand_ins import MNIST",
    "from lightning.pytorch.utilities.imports import _TORCHVISION_AVAILABLE":
        "from cli_stand_ins import TORCHVISION_AVAILABLE as _TORCHVISION_AVAILABLE",
    "import torchvision\n": "import cli_stand_ins as torchvision\n",
    "from torchvision import transforms": "from cli_stand_ins import transforms",
    "from torchvision.utils import save_image": "from cli_stand_ins import save_image",
}

STAND_IN_MODULE = '''
import types

import torch

TORCHVISION_AVAILABLE = True


class MNIST(torch.utils.data.Dataset):
    """MNIST's sizes (60000 / 10000 images of 1 x 28 x 28, labels 0-9), pixels drawn per index."""

    def __init__(self, root, train=True, download=False, transform=None):
        self.train, self.transform = train, transform

    def __len__(self):
        return 60000 if self.train else 10000

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index + (0 if self.train else 1_000_000))
        image = torch.randint(0, 256, (28, 28), generator=generator, dtype=torch.uint8)
        return (self.transform(image) if self.transform else image), index % 10


class ToTensor:
    def __call__(self, image):
        return image.float().div(255).unsqueeze(0)


def make_grid(tensor, **kwargs):
    return torch.cat(list(tensor), dim=-1)


def save_image(tensor, path, **kwargs):
    pass


transforms = types.SimpleNamespace(ToTensor=ToTensor)
utils = types.SimpleNamespace(make_grid=make_grid, save_image=save_image)
'''

RECORDER_MODULE = '''
import json

from lightning.pytorch.callbacks import Callback


class StepRecorder(Callback):
    """Rank 0's loss of each training step and the test metrics, written to ``path``."""

    def __init__(self, path: str):
        self.path, self.record = path, {"train_loss": []}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            self.record["train_loss"].append(float(outputs["loss"]))

    def on_test_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.record["test"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test")}

    def on_predict_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            with open(self.path, "w") as f:
                json.dump(self.record, f)
'''


def port(source: str, side: str) -> str:
    """The example with the stand-ins' import lines, and for ``ours`` its Lightning imports rewritten."""
    for line, replacement in STAND_INS.items():
        source = source.replace(line, replacement)
    return rewrite_imports(source) if side == "ours" else source


def run(checkout: str, example: str, side: str, work: str) -> dict:
    directory = os.path.join(work, os.path.basename(example)[:-3], side)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(checkout, example)) as f:
        source = f.read()
    files = {"example.py": port(source, side), "cli_stand_ins.py": STAND_IN_MODULE,
             "cli_recorder.py": port(RECORDER_MODULE, side)}
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([directory, REPO])}
    done = subprocess.run([sys.executable, "example.py", *ARGS], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if re.match(r"^[\w.]*(Error|Exception)\b", line)]
        return {"ran": False, "error": errors[-1] if errors else done.stderr[-500:]}
    with open(os.path.join(directory, "record.json")) as f:
        return {"ran": True, **json.load(f)}


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= RTOL * max(abs(y), 1e-12) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="a checkout of Lightning's repository (its examples/pytorch)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--only", action="append", help="run this example (its path in the checkout) alone")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for example in options.only or EXAMPLES:
            lightning, ours = (run(options.checkout, example, side, work) for side in ("lightning", "ours"))
            row = {"example": example, "lightning": lightning, "ours": ours}
            if lightning["ran"] and ours["ran"]:
                row["same_losses"] = same(ours["train_loss"], lightning["train_loss"])
                keys = sorted(lightning.get("test", {}))
                row["same_test"] = keys == sorted(ours.get("test", {})) and same(
                    [ours["test"][k] for k in keys], [lightning["test"][k] for k in keys])
            rows.append(row)
            status = {side: "ran" if row[side]["ran"] else row[side]["error"] for side in ("lightning", "ours")}
            print(f"{example}: {status}, same losses {row.get('same_losses')}, same test {row.get('same_test')}")
    if options.out:
        with open(options.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
