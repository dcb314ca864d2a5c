"""The DeepSpeed JSON import from Python (no Hydra)::

    from trainer.deepspeed_config import from_deepspeed_config

    ds = from_deepspeed_config("ds_config.json", devices=2)
    module = MyModule(optimizer=ds.optimizer, scheduler=ds.scheduler)   # factories (None: the JSON has none)
    trainer = ds.trainer(max_steps=100)   # Trainer(...) with the JSON's settings; keyword arguments win
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# The trainer / data settings the JSON can set, as Trainer keyword arguments.
_TRAINER_PATHS = {
    "trainer.accumulate_grad_batches": "accumulate_grad_batches", "trainer.gradient_clip_val": "gradient_clip_val",
    "trainer.log_every_n_steps": "log_every_n_steps", "trainer.activation_checkpointing": "activation_checkpointing",
    "data.batch_size": "batch_size", "data.global_batch_size": "global_batch_size", "data.drop_last": "drop_last",
}


@dataclass
class DeepSpeedSettings:
    """What a DeepSpeed JSON means, ready for ``Trainer`` and a ``TrainModule``."""

    trainer_kwargs: dict[str, Any]
    optimizer: Callable | None  # params -> Optimizer (None: the JSON has no optimizer block)
    scheduler: Callable | None  # optimizer -> LR scheduler (None: the JSON has no scheduler block)

    def trainer(self, **kwargs: Any) -> Any:
        """``Trainer(**trainer_kwargs)`` with ``kwargs`` winning (as the command line wins over the JSON)."""
        from trainer.trainer import Trainer

        return Trainer(**{**self.trainer_kwargs, **kwargs})


def from_deepspeed_config(path: str, devices: int = 1, num_nodes: int = 1, accelerator: str = "auto") -> DeepSpeedSettings:
    """Read the DeepSpeed config at ``path`` for ``devices x num_nodes`` processes (see the package docstring)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from trainer.deepspeed_config.apply import apply_json

    cfg = OmegaConf.create({"trainer": {"devices": devices, "num_nodes": num_nodes, "accelerator": accelerator,
                                        "profile": {}}, "data": {}, "logger": {}, "strategy": None})
    mapped = apply_json(cfg, path)
    kwargs = {name: OmegaConf.select(cfg, key) for key, name in _TRAINER_PATHS.items() if key in mapped.leaves}
    kwargs.update(devices=devices, num_nodes=num_nodes, accelerator=accelerator,
                  profile={"wall_clock_breakdown": bool(cfg.trainer.profile.wall_clock_breakdown)},
                  strategy=instantiate(cfg.strategy), precision=instantiate(cfg.precision),
                  loggers=OmegaConf.to_container(cfg.logger))
    optimizer = instantiate(cfg.optimizer) if cfg.get("optimizer") is not None else None
    scheduler = instantiate(cfg.scheduler) if cfg.get("scheduler") is not None else None
    return DeepSpeedSettings(kwargs, optimizer, scheduler)
