"""Watching a run without changing it: progress bars (``progress.py``), speed and MFU
(``throughput.py``), the wall-clock breakdown and profiler traces (``profiling.py``) and the model
summary (``model_summary.py``)."""
