"""What every Hugging Face TrainModule shares: the model built on each rank from a local directory
or a config, and the parallelism read from the model's own declarations.

- FSDP units and activation checkpointing: the classes named by the model's ``_no_split_modules``
  (or ``blocks=``); a model naming none is refused under FSDP before any worker starts.
- Tensor parallel: the config's ``base_model_tp_plan`` and the task class's ``_tp_plan``
  (transformers' strings mapped to torch styles, ``trainer/hf/tp_plan.py``), or ``tp_plan=``.
- Weights: a directory with safetensors starts from them (``trainer.init_from`` wins when set),
  loaded after the strategy laid the model out, each rank reading only its own part.
- Pipeline parallel: refused before any worker starts (the decoder layers take keyword inputs a
  stage cannot pass on).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainer.api.module import TrainModule
from trainer.hf import source, tp_plan
from trainer.hf.export import export_pretrained


class HFModule(TrainModule):
    """A transformers model as ``self.model``, built in ``configure_model`` on every rank.

    Args:
        path: a local directory written by ``save_pretrained`` (``config.json``; with
            ``model.safetensors`` or an index of shards, the run starts from those weights).
        config: a ``transformers.PretrainedConfig`` instead of ``path`` (random weights).
        optimizer / scheduler: as ``TrainModule``'s.
        pretrained: false: random weights even when ``path`` holds weights.
        blocks: class names of the FSDP units / checkpointed blocks; null: ``_no_split_modules``.
        tp_plan: ``{name: style}`` relative to this module (``"model.model.layers.*.mlp.up_proj"``),
            styles as transformers' strings or torch ParallelStyles; null: the model's own plan.
        export_dir: at the end of ``fit``, write the trained model there as a directory
            ``from_pretrained`` reads (config, safetensors, the tokenizer files of ``path``).
    """

    auto_class = "AutoModel"  # the transformers Auto class that picks the model class for the config

    def __init__(self, path: str | None = None, config: Any = None, optimizer: Any = None, scheduler: Any = None,
                 pretrained: bool = True, blocks: list[str] | None = None, tp_plan: dict | None = None,
                 export_dir: str | None = None):
        super().__init__(optimizer, scheduler)
        self.export_dir = export_dir
        self.path = source.check_model_dir(path) if path is not None else None
        self.hf_config = source.load_config(self.path, config)
        self.model_class = source.model_class(self.hf_config, self.auto_class)
        self.pretrained_dir = self.path if pretrained and self.path and source.weight_files(self.path) else None
        self.blocks = list(blocks) if blocks is not None else None
        self.user_tp_plan = tp_plan
        self.model: nn.Module | None = None
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The directory's tokenizer (``AutoTokenizer``), or None when it has no tokenizer files."""
        if self._tokenizer is None and self.path is not None:
            self._tokenizer = source.load_tokenizer(self.path)
        return self._tokenizer

    def configure_model(self) -> None:
        # Built on each rank after seeding (every rank the same weights). On the meta device under
        # strategy.meta_init=true, and whenever the weights come from the files: then the strategy
        # materialises it unit by unit (each rank only its shards) before the files are read.
        if self.model is not None:
            return
        from_files = self.pretrained_dir is not None
        with torch.device("meta") if from_files else contextlib.nullcontext():
            model = self.model_class(self.hf_config)
        if _shares_parameters(model):  # tied embeddings: materialising on its own would untie them
            if from_files:
                model = self.model_class(self.hf_config)  # where the strategy builds
            if any(p.is_meta for p in model.parameters()):
                raise ValueError(f"{self.model_class.__name__} ties parameters (tie_word_embeddings) and a meta-device "
                                 "build would untie them; set strategy.meta_init=false")
        self.model = model

    def forward(self, **inputs: Any) -> Any:
        return self.model(**inputs)

    def init_weights(self, module: nn.Module) -> None:
        # transformers' own initialisation (norms, embeddings, rotary frequencies of a meta build).
        if self.model is not None and any(module is m for m in self.model.modules()):
            self.model._init_weights(module)

    # ----- what the run loads and exports ----------------------------------------------------------------
    def initial_weights(self) -> str | None:
        """The directory of safetensors the run starts from (``path``'s), or None."""
        return self.pretrained_dir

    def on_fit_end(self) -> None:
        if self.export_dir is None:
            return
        state = self.trainer.strategy.full_state_dict(self)  # every rank: a collective; rank 0 holds it
        if state:
            export_pretrained(state, self.hf_config, self.export_dir, self.auto_class, tokenizer_dir=self.path)

    # ----- FSDP units, activation checkpointing ------------------------------------------------------------
    def _block_names(self) -> list[str]:
        if self.blocks is not None:
            return self.blocks
        return list(getattr(self.model_class, "_no_split_modules", None) or [])

    def check_sharding_units(self) -> None:
        if not self._block_names():
            raise ValueError(f"{self.model_class.__name__} declares no _no_split_modules, so FSDP cannot find its "
                             "blocks; pass its block class names as blocks=[...] (model.blocks=[...] in the recipe) "
                             "or strategy.wrap=[ClassName]")

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        names = set(self._block_names())
        found = {type(m) for m in (self.model.modules() if self.model is not None else ()) if type(m).__name__ in names}
        if self.blocks is not None and len(found) < len(names):
            missing = sorted(names - {c.__name__ for c in found})
            raise ValueError(f"blocks={missing} are no submodule classes of {self.model_class.__name__}")
        return tuple(sorted(found, key=lambda c: c.__name__))

    # ----- tensor parallel -------------------------------------------------------------------------------
    def tensor_parallel_plan(self) -> dict[str, Any] | None:
        owner = self.model_class.__name__
        if self.user_tp_plan is not None:
            return tp_plan.to_styles(dict(self.user_tp_plan), "", f"{owner} (tp_plan=)")
        declared = tp_plan.declared_plan(self.model_class, self.hf_config, "model")
        return None if declared is None else tp_plan.to_styles(declared, "", owner)

    def check_tensor_parallel(self, tp: int) -> None:
        if self.user_tp_plan is None and not getattr(self.hf_config, "base_model_tp_plan", None):
            raise ValueError(f"strategy.tp={tp} but {type(self.hf_config).__name__} declares no base_model_tp_plan; "
                             "pass tp_plan={name: style} (module.tp_plan) or use strategy=fsdp")
        sizes = {name: getattr(self.hf_config, name, None) for name in
                 ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")}
        bad = [f"{name}={size}" for name, size in sizes.items() if isinstance(size, int) and size % tp]
        if bad:
            raise ValueError(f"strategy.tp={tp} does not divide the model's {', '.join(bad)}; choose a tp dividing them")

    def check_pipeline(self) -> None:
        raise ValueError(f"strategy=pipeline (or strategy.pp > 1) cannot cut {self.model_class.__name__} into "
                         "stages: its layers take keyword inputs (attention masks, position embeddings) a stage "
                         "boundary does not pass on; allowed: strategy=single, ddp, fsdp or nd with pp=1 "
                         "(tensor parallel from the model's plan)")

    def pipeline_layers(self) -> list[nn.Module] | None:
        self.check_pipeline()  # raises: also where a rank, or the estimator, asks for the layers
        return None



def _shares_parameters(model: nn.Module) -> bool:
    """Whether two of the model's names hold the same parameter (tied weights)."""
    return len(list(model.named_parameters(remove_duplicate=False))) != len(list(model.parameters()))
