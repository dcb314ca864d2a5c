"""Optimizers and learning-rate schedules: what ``configure_optimizers`` may return
(``optimizers.py``), when schedulers step (``lr_scheduling.py``), the built-in schedules
(``schedules.py``) and loading optimizer state in place (``param_groups.py``)."""
