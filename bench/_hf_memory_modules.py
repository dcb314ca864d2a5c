"""The module bench/hf_load_memory.py trains, in its own file: spawned workers unpickle it by name."""

from __future__ import annotations

import json
import os

import torch

from trainer.hf import HFCausalLM


def status_kib(field: str) -> int:
    """A field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``) in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak() -> bool:
    """Set this process's peak RSS (``VmHWM``) back to its current RSS (Linux: ``/proc/self/clear_refs``);
    False where that is not allowed (then the peak since the process started is read: an upper bound)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def import_model_code(path: str) -> None:
    """Import transformers' modeling code for the directory's config (a throw-away build on the meta
    device, nothing allocated): a fresh process would otherwise count those imports inside the window."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))


class LoadMeasuredLM(HFCausalLM):
    """HFCausalLM that measures each rank's resident memory over the load of its directory's weights:
    from the start of ``configure_model`` (the peak reset there) to ``on_fit_start`` (the model built
    on the meta device, laid out by the strategy, materialised and read from the files), written to
    ``<out>/load_rank<r>.json``: ``rss_before``, ``peak`` (``VmHWM``) and ``peak_increase`` in bytes,
    ``rss_file_after`` (file pages mapped then), ``param_bytes`` (the rank's own parameters)."""

    def __init__(self, out: str, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    def val_dataset(self):
        return None

    def configure_model(self):
        import_model_code(self.path)
        self._reset = reset_peak()
        self._rss_before = status_kib("VmRSS") * 1024
        super().configure_model()

    def on_fit_start(self):
        from trainer.runtime.tensors import local_tensor

        peak = status_kib("VmHWM") * 1024
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        figures = {"rss_before": self._rss_before, "peak": peak, "peak_increase": peak - self._rss_before,
                   "peak_reset": self._reset, "rss_file_after": status_kib("RssFile") * 1024,
                   "param_bytes": sum(local_tensor(p).numel() * p.element_size() for p in self.parameters())}
        with open(os.path.join(self.out, f"load_rank{rank}.json"), "w") as f:
            json.dump(figures, f)
