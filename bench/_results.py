"""The result file a bench script writes under bench/results/ (bench/plot_results.py draws the docs'
figures from them), in one format:

``{"benchmark": name, "date": ISO UTC, "command": the command line that produced it,
"machine": {platform, processor, cpu_count, python, torch, lightning (None: not installed)},
"load_average": {"start", "end"} (1-minute load average: above 1 per core, other work shared the
machine), "settings": {...}, "results": ...}``, the last two as each script documents.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict:
    """What the figures were measured on."""
    import torch

    try:
        import lightning

        lightning_version = lightning.__version__
    except ImportError:
        lightning_version = None
    processor = platform.processor() or platform.machine()
    try:  # the model name says more than "x86_64"
        with open("/proc/cpuinfo") as f:
            processor = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"platform": platform.platform(), "processor": processor, "cpu_count": os.cpu_count(),
            "gpu": gpu, "python": platform.python_version(), "torch": torch.__version__, "lightning": lightning_version}


class Recorder:
    """Made when the measurement starts (the date, the load average); ``write(results)`` at its end writes
    the file to ``path`` (default bench/results/<name>.json) with the machine and the load average then."""

    def __init__(self, name: str, settings: dict, path: str | None = None):
        self.name, self.settings = name, settings
        self.path = path or os.path.join(RESULTS, f"{name}.json")
        self.date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.load_start = os.getloadavg()[0]

    def write(self, results) -> None:
        root = os.path.dirname(os.path.dirname(RESULTS))
        command = " ".join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), root)] + sys.argv[1:])
        result = {"benchmark": self.name, "date": self.date, "command": command, "machine": machine(),
                  "load_average": {"start": self.load_start, "end": os.getloadavg()[0]},
                  "settings": self.settings, "results": results}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"written: {os.path.relpath(self.path)}")
