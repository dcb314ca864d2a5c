"""Lightning's ``lightning.pytorch.utilities``: the rank-zero helpers (``rank_zero.py``), ``grad_norm``
(``grads.py``), ``AttributeDict`` (``self.hparams``' type), ``move_data_to_device``; ``types.py`` and
``imports.py`` mirror Lightning's modules of those names, ``model_helpers.py`` has ``is_overridden``. Other names are an ImportError saying what to use."""

from typing import Any

import torch

from trainer.api.hparams import AttributeDict
from trainer.lightning._missing import missing_names
from trainer.lightning.utilities.grads import grad_norm
from trainer.lightning.utilities.enums import GradClipAlgorithmType
from trainer.lightning.utilities.rank_zero import (rank_zero_debug, rank_zero_deprecation, rank_zero_info,
                                                   rank_zero_only, rank_zero_warn)
from trainer.runtime.tensors import move_to_device


def move_data_to_device(batch: Any, device: Any) -> Any:
    """``batch`` (tensors in lists, tuples, dicts) with every tensor moved to ``device``."""
    return move_to_device(batch, torch.device(device))


__all__ = ["AttributeDict", "GradClipAlgorithmType", "grad_norm", "move_data_to_device", "rank_zero_debug", "rank_zero_deprecation",
           "rank_zero_info", "rank_zero_only", "rank_zero_warn"]

__getattr__ = missing_names(__name__, {
    "CombinedLoader": ("a list or dict of DataLoaders for test / predict; one DataLoader for fit and validate "
                       "(combine the datasets, e.g. torch.utils.data.ConcatDataset)"),
    "disable_possible_user_warnings": "warnings.filterwarnings (this trainer's messages are log records)",
    "find_shared_parameters": "nothing: tied parameters are found by the strategies themselves",
    "set_shared_parameters": "nothing: tied parameters are found by the strategies themselves",
    "LightningEnum": "enum.Enum",
    "is_picklable": "pickle.dumps in a try block",
    "measure_flops": "the perf/ metrics the trainer logs (trainer/observe/throughput.py)",
    "is_shared_filesystem": "nothing: the trainer's checkpoints assume a filesystem every node sees",
    "suggested_max_num_workers": "DataLoader(num_workers=...) with a number you choose",
})
