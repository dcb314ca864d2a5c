"""Modules and runners shared by the tests (importable by spawned workers)."""

from __future__ import annotations

import json
import os
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule, Trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def regression_data(num_samples: int = 200, features: int = 6, seed: int = 7) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = x @ w + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


class RegressionModule(TrainModule):
    """Data and steps of the regression test modules; subclasses define the network (forward)."""

    num_samples = 200
    val_samples = 0

    def train_dataset(self):
        return regression_data(self.num_samples)

    def val_dataset(self):
        return regression_data(self.val_samples, seed=8) if self.val_samples else None

    def training_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        return {"loss": F.mse_loss(prediction, y), "abs_error": (prediction - y).abs().mean()}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)


class Regressor(RegressionModule):
    """A small MLP on fixed data; saves its final parameters to ``<run_dir>/params.pt``."""

    def __init__(self, num_samples: int = 200, lr: float = 0.05, optimizer: str = "sgd", val_samples: int = 0,
                 count_syncs: bool = False):
        factory = partial(torch.optim.SGD, lr=lr, momentum=0.9) if optimizer == "sgd" else partial(torch.optim.AdamW, lr=lr)
        # Only the default configure_optimizers uses the factory; an override builds its own (a factory
        # it ignored would be an error: trainer/optim/optimizers.py configure_optimizers).
        super().__init__(optimizer=factory if type(self).configure_optimizers is TrainModule.configure_optimizers else None)
        self.num_samples, self.val_samples, self.count_syncs = num_samples, val_samples, count_syncs
        torch.manual_seed(0)  # the same initial weights however many modules a test built before
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.sync_log: list[int] = []

    def forward(self, x):
        return self.net(x)

    def on_fit_start(self):
        if self.count_syncs:
            self._calls = [0]
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            wrapped = self.trainer_run_wrapped()
            if wrapped is not None:
                def counting_hook(state, bucket):
                    state[0] += 1
                    return default_hooks.allreduce_hook(None, bucket)

                wrapped.register_comm_hook(self._calls, counting_hook)

    def trainer_run_wrapped(self):
        from torch.nn.parallel import DistributedDataParallel

        return self.trainer.model if isinstance(self.trainer.model, DistributedDataParallel) else None

    def on_before_optimizer_step(self, optimizer):
        if self.count_syncs:
            self.sync_log.append(self._calls[0])
            self._calls[0] = 0

    def on_fit_end(self):
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        run_dir = self.trainer.run_dir
        torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()}, os.path.join(run_dir, "params.pt"))
        with open(os.path.join(run_dir, "syncs.json"), "w") as f:
            json.dump(self.sync_log, f)


def read_metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(run_dir: str) -> list[float]:
    return [r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r]


def fit(run_dir: str, module: TrainModule | None = None, **trainer_args) -> tuple[list[float], dict]:
    """Fit a Regressor (or ``module``) and return (per-step losses, final parameters)."""
    run_trainer(run_dir, module if module is not None else Regressor(), **trainer_args)
    return train_losses(str(run_dir)), torch.load(os.path.join(str(run_dir), "params.pt"))


def run_trainer(run_dir: str, module: TrainModule, **trainer_args):
    """``Trainer.fit`` with the tests' defaults (``new_trainer``)."""
    return new_trainer(run_dir, **trainer_args).fit(module)


def new_trainer(run_dir: str, **trainer_args) -> Trainer:
    """A Trainer with the tests' defaults: every step logged to metrics.jsonl, no progress bar."""
    args = dict(max_steps=8, log_every_n_steps=1, loggers=["jsonl"], progress_bar=False, collective_timeout_s=120,
                run_dir=str(run_dir))
    args.update(trainer_args)
    return Trainer(**args)


class VariableLengthTokens(TrainModule):
    """Sequences with a varying number of valid tokens: the loss is a mean over valid tokens."""

    def __init__(self, lr: float = 0.1):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=lr))
        torch.manual_seed(0)
        self.embed = nn.Embedding(11, 8)
        self.head = nn.Linear(8, 11)

    def train_dataset(self):
        generator = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, 11, (40, 12), generator=generator)
        lengths = torch.randint(1, 13, (40,), generator=generator)
        mask = torch.arange(12)[None, :] < lengths[:, None]
        return TensorDataset(tokens, mask)

    def training_step(self, batch, batch_idx):
        return self.pipeline_loss(self.head(self.embed(self.pipeline_input(batch))), batch)

    def pipeline_layers(self):
        return [self.embed, self.head]

    def pipeline_input(self, batch):
        return batch[0][:, :-1]

    def pipeline_loss(self, logits, batch):
        tokens, mask = batch
        losses = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        valid = mask[:, 1:].float()
        num_tokens = valid.sum()
        return {"loss": (losses * valid).sum() / num_tokens.clamp_min(1), "num_tokens": num_tokens}

    def on_fit_end(self):
        state = self.trainer.strategy.full_state_dict(self)  # every rank: a collective under pipeline
        if state:
            torch.save(state, os.path.join(self.trainer.run_dir, "params.pt"))


class PythonCountTokens(VariableLengthTokens):
    """VariableLengthTokens whose token count is a Python int (every position counts): the trainer
    keeps such a count on the host, with no copy to the device per micro-batch."""

    def pipeline_loss(self, logits, batch):
        tokens = batch[0]
        loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
        return {"loss": loss, "num_tokens": tokens.shape[0] * (tokens.shape[1] - 1)}


class FusedAdamWTokens(PythonCountTokens):
    """PythonCountTokens stepped by a fused AdamW: it skips an fp16 overflow on a device flag, so fp16
    steps make no host read (trainer/precision/fp16_step.py)."""

    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.optimizer_factory = partial(torch.optim.AdamW, lr=lr, fused=True)


class PrepareDataRecorder(Regressor):
    """Records which ranks ran prepare_data, and when relative to the others."""

    def prepare_data(self):
        import time

        marker = os.path.join(self.trainer.run_dir, "prepared")
        with open(marker, "a") as f:
            f.write(f"{os.environ.get('LOCAL_RANK', '0')} {time.time()}\n")


class MismatchedMetrics(Regressor):
    """Rank 1 returns a metric rank 0 does not: the trainer must raise, not hang."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        if torch.distributed.get_rank() == 1:
            out["extra"] = out["loss"].detach()
        return out


class ResidualBlock(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(torch.tanh(self.linear(self.norm(x))))


class BlockRegressor(RegressionModule):
    """Regression with residual blocks, built in configure_model (so strategy.meta_init applies);
    the blocks are its FSDP units. Saves the full final parameters to ``<run_dir>/params.pt`` and,
    with ``record_memory``, each rank's training-state bytes at the third step."""

    def __init__(self, lr: float = 0.01, width: int = 32, depth: int = 3, num_samples: int = 200,
                 val_samples: int = 0, record_memory: bool = False, dropout: float = 0.0):
        factory = partial(torch.optim.AdamW, lr=lr, weight_decay=0.01)
        super().__init__(optimizer=factory if type(self).configure_optimizers is TrainModule.configure_optimizers else None)
        self.width, self.depth, self.num_samples, self.val_samples = width, depth, num_samples, val_samples
        self.record_memory, self.dropout = record_memory, dropout
        self.steps = 0

    def configure_model(self):
        self.inp = nn.Linear(6, self.width)
        self.blocks = nn.ModuleList(ResidualBlock(self.width, self.dropout) for _ in range(self.depth))
        self.out = nn.Linear(self.width, 1)

    def block_classes(self):
        return (ResidualBlock,)

    def pipeline_layers(self):
        return [self.inp, *self.blocks, self.out]

    def pipeline_loss(self, output, batch):
        _, y = batch
        return {"loss": F.mse_loss(output, y), "abs_error": (output - y).abs().mean()}

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


    def on_before_optimizer_step(self, optimizer):
        self.steps += 1
        if self.record_memory and self.steps == 3:  # gradients present, optimizer state allocated
            from trainer.runtime.memory import training_state_bytes

            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            with open(os.path.join(self.trainer.run_dir, f"memory_rank{rank}.json"), "w") as f:
                json.dump(training_state_bytes(self, optimizer), f)

    def on_fit_end(self):
        state = self.trainer.strategy.full_state_dict(self)  # every rank: a collective under FSDP
        if state:
            torch.save(state, os.path.join(self.trainer.run_dir, "params.pt"))


class BuildRecorder(BlockRegressor):
    """A BlockRegressor that owns its init (plain ``reset_parameters``) and records the most
    parameter elements its rank held at any point of the build, and what it kept, in
    ``<run_dir>/build_rank<r>.json``."""

    most_held = 0

    def init_weights(self, submodule):
        if submodule is not self and callable(getattr(submodule, "reset_parameters", None)):
            submodule.reset_parameters()
        held = sum(p.numel() for p in self.parameters() if not p.is_meta)
        self.most_held = max(self.most_held, held)

    def on_fit_start(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(self.trainer.run_dir, f"build_rank{rank}.json"), "w") as f:
            json.dump({"most_held": self.most_held, "kept": sum(p.numel() for p in self.parameters())}, f)


class TiedAcrossStages(RegressionModule):
    """Pipeline layers whose middle one shares the first one's weight (or, with ``extra``, a
    parameter outside every layer): both refused by strategy=pipeline."""

    def __init__(self, extra: bool = False):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.1))
        self.extra_parameter = extra

    def configure_model(self):
        self.inp, self.mid, self.out = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 1)
        self.mid.weight = self.inp.weight
        if self.extra_parameter:
            self.extra = nn.Parameter(torch.zeros(1))

    def pipeline_layers(self):
        return [self.inp, self.mid, self.out]


class CheckpointedRegressor(BlockRegressor):
    """A BlockRegressor with dropout (so resuming must restore the RNG) that can die or be
    preempted at a given step, as a killed or signalled job would."""

    def __init__(self, kill_at_step: int | None = None, signal_at_step: int | None = None, signal_launcher: bool = False,
                 augment: bool = False, **kwargs):
        kwargs.setdefault("dropout", 0.1)
        super().__init__(**kwargs)
        self.kill_at_step, self.signal_at_step, self.signal_launcher = kill_at_step, signal_at_step, signal_launcher
        self.launcher_pid = os.getpid()  # built in the launcher; its workers train pickled copies
        self.augment = augment

    def train_dataset(self):
        data = super().train_dataset()
        return NoisyInputs(data) if self.augment else data

    def on_train_step_end(self, step, metrics):
        import signal

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if step == self.kill_at_step and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            # A crash after the last save committed: rank 0 commits in a thread, which a SIGKILL a
            # few milliseconds after the save would cut off (that run resumes from the save before).
            from trainer.checkpoint import layout

            layout.settle(os.path.join(self.trainer.run_dir, "checkpoints"))
            os.kill(os.getpid(), signal.SIGKILL)  # on a torchrun restart, the job goes on
        if step == self.signal_at_step and rank == 0:
            # Like SLURM or a user sending SIGTERM to the job: to the launcher, which forwards it.
            os.kill(self.launcher_pid if self.signal_launcher else os.getpid(), signal.SIGTERM)


class KilledBeforeStep(CheckpointedRegressor):
    """A CheckpointedRegressor that dies (SIGKILL) as step ``kill_before_step`` starts, once its last
    save committed: nothing is logged between that commit and the kill."""

    def __init__(self, kill_before_step: int, **kwargs):
        super().__init__(**kwargs)
        self.kill_before_step = kill_before_step

    def on_train_batch_start(self, batch, batch_idx):
        if self.trainer.global_step + 1 == self.kill_before_step:
            import signal

            from trainer.checkpoint import layout

            layout.settle(os.path.join(self.trainer.run_dir, "checkpoints"))
            os.kill(os.getpid(), signal.SIGKILL)


class NoisyInputs(torch.utils.data.Dataset):
    """A random augmentation drawn while loading (in data-loader workers when there are some)."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        x, y = self.data[index]
        return x + 0.1 * torch.randn_like(x), y


class OverflowAt(BlockRegressor):
    """Makes the loss infinite at one step on one rank (a forced fp16 overflow or a diverging
    run), and saves each rank's own parameters at the end."""

    def __init__(self, bad_step: int = 3, bad_rank: int = 0, value: float = float("inf"), **kwargs):
        super().__init__(**kwargs)
        self.bad_step, self.bad_rank, self.value = bad_step, bad_rank, value
        self.done = 0

    def training_step(self, batch, batch_idx):
        return self._spoil(super().training_step(batch, batch_idx))

    def pipeline_loss(self, output, batch):
        return self._spoil(super().pipeline_loss(output, batch)) if self.training else super().pipeline_loss(output, batch)

    def _spoil(self, out):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        if self.done + 1 == self.bad_step and rank == self.bad_rank:
            out["loss"] = out["loss"] * self.value
        return out

    def on_train_step_end(self, step, metrics):
        self.done = step

    def on_fit_end(self):
        super().on_fit_end()
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        state = {k: v.detach().clone() for k, v in self.state_dict().items() if not hasattr(v, "placements")}
        torch.save(state, os.path.join(self.trainer.run_dir, f"params_rank{rank}.pt"))


# The hot-path probe lives in its own file; imported here, where the tests have found it.
from trainer.observe.host_syncs import HostSyncCounter, HotPathProbe, read_hot_path  # noqa: E402,F401


class BatchSizeReporter(Regressor):
    """A Regressor whose every rank writes ``batch_size_rank<r>.json`` in the run directory at fit end:
    ``trainer.batch_size`` (the batch-size finder's choice) and the sizes of the batches it trained on."""

    def training_step(self, batch, batch_idx):
        self.__dict__.setdefault("seen_sizes", []).append(int(batch[0].shape[0]))
        return super().training_step(batch, batch_idx)

    def on_fit_end(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(self.trainer.run_dir, f"batch_size_rank{rank}.json"), "w") as f:
            json.dump({"batch_size": self.trainer.batch_size, "seen": self.__dict__.get("seen_sizes", [])}, f)
        super().on_fit_end()
