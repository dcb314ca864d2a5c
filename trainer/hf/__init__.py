"""Hugging Face models: any transformers model from a local directory or a config, trained on every
strategy, its weights loaded into any layout and exported back as a directory ``from_pretrained``
reads (docs/how-to/hugging-face.md).

``HFCausalLM`` and ``HFSequenceClassification`` are TrainModules; ``export_pretrained`` writes a
directory from a full state dict. transformers and safetensors (``pip install 'meshtrainer[hf]'``)
are imported when a model is built, never by the core package.
"""

from trainer.hf.base import HFModule
from trainer.hf.causal_lm import HFCausalLM
from trainer.hf.classification import HFSequenceClassification

__all__ = ["HFModule", "HFCausalLM", "HFSequenceClassification"]
