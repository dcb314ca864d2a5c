"""DeepSpeed JSON configs: ``python train.py +deepspeed_config=ds_config.json [overrides]``.

Every key we map means what it means in DeepSpeed 0.19 (defaults of omitted keys included); the
README's "DeepSpeed configs" table lists the mapping. The JSON's values replace the composed config
(defaults and recipe); overrides typed on the command line win over the JSON. Keys that only tune
DeepSpeed's speed are named in one warning; keys that change the math and are not reproduced, and
inconsistent values (batch sizes that imply another world size than ``trainer.devices x num_nodes``),
are a one-line error before any worker starts.

Files: ``reading.py`` (the file, key kinds), ``values.py`` (value checks), ``batch.py``,
``precision.py`` (fp16 / bf16), ``zero.py`` (ZeRO stage, offload -> strategy), ``optimizer.py``
(optimizer, scheduler), ``schedulers.py`` (DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR as torch
schedulers), ``monitors.py`` (loggers, clipping, logging cadence, profiling, activation checkpointing),
``mapping.py`` (all of it), ``apply.py`` (precedence, into the composed config), ``python_api.py``.
"""

from trainer.deepspeed_config.apply import apply_json
from trainer.deepspeed_config.python_api import DeepSpeedSettings, from_deepspeed_config
from trainer.deepspeed_config.schedulers import WarmupCosineLR, WarmupDecayLR, WarmupLR

__all__ = ["apply_json", "from_deepspeed_config", "DeepSpeedSettings", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
