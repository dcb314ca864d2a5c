"""Where a Hugging Face model comes from: a local directory (its ``config.json``, weights and
tokenizer files) or a config object. Nothing here downloads: a name that is not a local directory
is refused, saying to pass one (``transformers``' own ``save_pretrained`` / ``snapshot_download``
make such a directory where there is a network).

``transformers`` is imported inside the functions, so ``import trainer.hf`` costs nothing and the
core package never imports it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from trainer.checkpoint.safetensors_dir import INDEX_FILE, SINGLE_FILE  # save_pretrained's weight files

#: the tokenizer files ``save_pretrained`` of a tokenizer writes (those present are copied on export)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja")


def require_transformers() -> Any:
    """The ``transformers`` module, or one line saying how to install it."""
    try:
        import transformers
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("Hugging Face models need transformers and safetensors: "
                                  "pip install 'meshtrainer[hf]'") from error
    return transformers


def check_model_dir(path: str, setting: str = "module.path") -> str:
    """``path`` as an absolute directory holding ``config.json``; a ValueError (one line) otherwise:
    a hub name (no such local directory) is told to pass a local directory."""
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        raise ValueError(f"{setting}={path!r} is not a local directory; models are not downloaded at run time: "
                         "download it first (e.g. huggingface_hub.snapshot_download or save_pretrained) and pass "
                         "its local directory")
    if not os.path.isdir(path):
        raise ValueError(f"{setting}={path!r} is a file; pass the model's directory (config.json, *.safetensors)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{setting}={path!r} has no config.json; pass a directory written by save_pretrained "
                         "(config.json and model.safetensors, or config.json alone for random weights)")
    return os.path.abspath(path)


def weight_files(path: str) -> list[str]:
    """The directory's safetensors files (one file, or the shards its index names); [] when it holds none."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        missing = [name for name in shards if not os.path.isfile(os.path.join(path, name))]
        if missing:
            raise ValueError(f"{path}: {INDEX_FILE} names {missing[:3]} which are not in the directory; "
                             "copy the whole model directory")
        return [os.path.join(path, name) for name in shards]
    single = os.path.join(path, SINGLE_FILE)
    return [single] if os.path.isfile(single) else []


def load_config(path: str | None, config: Any) -> Any:
    """The model's ``PretrainedConfig``: read from ``path``, or ``config`` itself (exactly one given)."""
    if (path is None) == (config is None):
        raise ValueError("give a Hugging Face model as path= (a local directory) or config= (a PretrainedConfig), "
                         "exactly one of them")
    transformers = require_transformers()
    if config is not None:
        if not isinstance(config, transformers.PretrainedConfig):
            raise ValueError(f"config={type(config).__name__} is not a transformers PretrainedConfig "
                             "(e.g. transformers.LlamaConfig(...))")
        return config
    return transformers.AutoConfig.from_pretrained(check_model_dir(path), local_files_only=True)


def model_class(config: Any, auto_name: str) -> type:
    """The transformers class ``transformers.<auto_name>`` builds for ``config`` (e.g.
    ``AutoModelForCausalLM`` -> ``LlamaForCausalLM``); one line when it has none for that config."""
    auto = getattr(require_transformers(), auto_name)
    mapping = auto._model_mapping
    try:
        return mapping[type(config)]
    except KeyError:
        raise ValueError(f"{auto_name} has no model for {type(config).__name__} (model_type "
                         f"{getattr(config, 'model_type', None)!r}); use a model type it supports") from None


def tokenizer_files(path: str | None) -> list[str]:
    """The tokenizer files present in ``path`` (none for a config object)."""
    if path is None:
        return []
    return [os.path.join(path, name) for name in TOKENIZER_FILES if os.path.isfile(os.path.join(path, name))]


def load_tokenizer(path: str | None) -> Any:
    """The directory's tokenizer (``AutoTokenizer``), or None when it holds no tokenizer files."""
    if not tokenizer_files(path):
        return None
    return require_transformers().AutoTokenizer.from_pretrained(path, local_files_only=True)
