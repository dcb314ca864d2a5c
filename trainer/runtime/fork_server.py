"""Imported only by the fork server the trainer's ``spawn`` starts (it is on its preload list).

The server is a helper process of the launcher: a signal meant for the job (SLURM's SIGTERM to every
process of a step, a user's ``kill`` of the process group) must reach the launcher and the workers,
which save and stop, and must not end the server, whose death would look like every worker dying.
The server still exits with the launcher (it watches a pipe from it). Workers put the default
dispositions back first thing (trainer/runtime/launch.py ``_spawned_entry``).
"""

import signal

from trainer.runtime.launch import JOB_SIGNALS

for _number in JOB_SIGNALS:
    signal.signal(_number, signal.SIG_IGN)
