"""``trainer.init_from=DIR`` of Hugging Face safetensors (``model.safetensors``, or shards with
``model.safetensors.index.json``): each rank reads only the slices of its own shards.

The module's state dict in its current layout (plain tensors, or DTensor shards under FSDP / tensor
parallel) is the request; torch's ``HuggingFaceStorageReader`` (``torch.distributed.checkpoint``)
answers it by reading each requested slice from the files (``safe_open(...).get_slice``), so no rank
materialises a whole copy of the model. The files' names are the transformers model's own
(``model.layers.0...``); the module may hold the model under a prefix (``model.``), found by
matching the names. Tensors tied to another (an output head sharing the embedding) need not be in
the files.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

from trainer.checkpoint.loading import CheckpointError

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def is_safetensors_dir(path: str) -> bool:
    """Whether ``path`` is a directory holding ``model.safetensors`` or a safetensors index."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name)) for name in (SINGLE_FILE, INDEX_FILE))


def _file_names(path: str) -> list[str]:
    from safetensors import safe_open

    names: list[str] = []
    for entry in sorted(os.listdir(path)):
        if entry.endswith(".safetensors"):
            with safe_open(os.path.join(path, entry), framework="pt") as f:
                names.extend(f.keys())
    return names


def _prefix(module_names: list[str], file_names: list[str]) -> str:
    """The prefix that turns the files' names into the module's, the one matching most names."""
    wanted = set(module_names)
    candidates = {name[: len(name) - len(file_names[0])] for name in module_names
                  if name == file_names[0] or name.endswith("." + file_names[0])}
    scored = sorted(candidates, key=lambda p: (-sum(p + n in wanted for n in file_names), len(p)))
    return scored[0] if scored else ""


def _tied(module: torch.nn.Module) -> dict[str, str]:
    """Names of parameters that are the same tensor as an earlier name's: {later name: first name}."""
    first: dict[int, str] = {}
    tied = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


def load_safetensors_dir(path: str, module: torch.nn.Module) -> None:
    """Load the directory's weights into ``module`` in its current layout (a collective under a
    process group: every rank reads its own slices). CheckpointError (one line) naming the names
    the files lack or hold in excess, or a shape that differs."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=False))
    file_names = _file_names(path)
    if not file_names:
        raise CheckpointError(f"trainer.init_from={path!r} holds no safetensors tensors")
    prefix = _prefix(list(state), file_names)
    tied = _tied(module)
    wanted = {name[len(prefix):]: name for name in state if name.startswith(prefix) and name not in tied}
    missing = sorted(set(wanted) - set(file_names))
    extra = sorted(set(file_names) - set(wanted) - {t[len(prefix):] for t in tied})
    if missing or extra:
        problems = ([f"missing {missing[:4]}"] if missing else []) + ([f"unexpected {extra[:4]}"] if extra else [])
        raise CheckpointError(f"trainer.init_from={path!r} does not fit {type(module).__name__} (names under prefix "
                              f"{prefix!r}): {'; '.join(problems)}")
    request = {file_name: state[name] for file_name, name in wanted.items()}
    try:
        with warnings.catch_warnings():  # DCP's note that it reads without a process group: intended in one process
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
            dcp_load(request, storage_reader=HuggingFaceStorageReader(path),
                     no_dist=not torch.distributed.is_initialized())
    except Exception as error:  # noqa: BLE001 - DCP wraps a shape mismatch in its own exception
        raise CheckpointError(f"trainer.init_from={path!r}: {str(error).splitlines()[0][:300]}") from error
    loaded = {name: request[file_name] for file_name, name in wanted.items()}
    set_model_state_dict(module, loaded, options=StateDictOptions(full_state_dict=False, strict=False))
    log.info("initialised the weights from %s (%d tensors, each rank its own slices)", path, len(loaded))
