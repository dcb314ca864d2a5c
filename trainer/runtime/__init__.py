"""The bottom layer: processes and what every other layer may use.

Process groups and the trainer's own collectives (``distributed.py``), where processes come from
(``launch.py``: torchrun, SLURM, spawning; ``elastic.py``: torchrun restarts), how they are watched
(``supervision.py``: the spawned workers' first failure; ``heartbeat.py``: a rank that stops responding
without dying), seeding
(``seeding.py``), rank-aware logging (``rank_logging.py``), the collectives recorder
(``comms_log.py``), device-side metric sums reduced on logging steps (``metric_sums.py``), memory
meters (``memory.py``, ``peak_memory.py``), tensor helpers (``tensors.py``), the argument checks every
layer validates with (``value_checks.py``) and the secret redaction rules every writer applies
(``redact.py``). Imports nothing else of the trainer.
"""
