"""``hydra/launcher=submitit_local`` and ``submitit_slurm`` as the trainer ships them (conf/hydra/launcher/):
Hydra's submitit launchers, with every setting checked against the jobs' trainer settings before any job is
submitted (`trainer.cli.launcher_check`). Without hydra-submitit-launcher installed (the ``slurm`` extra)
this module defines nothing."""

from __future__ import annotations

from typing import Any, Sequence

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit
except ImportError:  # the slurm extra is not installed
    _submitit = None

if _submitit is not None:

    class _Checked:
        """Hydra's submitit launcher of ``kind``, its settings and jobs checked before anything is submitted
        (imported when a launcher is built: Hydra scans this module at every start)."""

        kind: str

        def __init__(self, **params: Any) -> None:
            from trainer.cli.launcher_check import check_launcher_keys

            check_launcher_keys(self.kind, params)
            super().__init__(**params)  # type: ignore[call-arg]

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from trainer.cli.launcher_check import check_jobs

            check_jobs(self.kind, self, job_overrides)
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]

    class SubmititLocalLauncher(_Checked, _submitit.LocalLauncher):
        """Hydra's submitit launcher on this machine (each job a process group of its tasks), checked."""

        kind = "local"

    class SubmititSlurmLauncher(_Checked, _submitit.SlurmLauncher):
        """Hydra's submitit launcher on SLURM (each job an sbatch job, a sweep an array), checked."""

        kind = "slurm"
