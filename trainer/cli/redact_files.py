"""Keep secrets out of the files Hydra writes for a run (``.hydra/config.yaml``, ``overrides.yaml``,
``hydra.yaml``, and a multirun's ``multirun.yaml``): the same rules as the loggers
(`trainer.runtime.redact`).

Hydra writes these files itself, before it calls the task function, so `redact_hydra_files`
rewrites them at the start of the task (rank 0 only: the only rank that runs Hydra). A file is
rewritten only if it holds a secret; the others stay byte for byte as Hydra wrote them. Redacted:
values under secret-named keys; override strings whose key names a secret
(``+data.hf_token=...``); the values of secret-named environment variables and URL credentials
anywhere; and, in any string (e.g. ``hydra.job.override_dirname``), every value the resolved
config holds under a secret-named key (`secret_values`).
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from trainer.runtime.redact import REDACTED, is_secret_key, redact_argv, redact_secrets, secret_values

HYDRA_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")


def redact_tree(tree: Any, secrets: Iterable[str] = ()) -> Any:
    """``tree`` with secrets redacted (see the module docstring); the input is not modified."""
    secrets = list(secrets)

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: (REDACTED if is_secret_key(k) and v not in (None, "") else clean(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            for secret in secrets:
                value = value.replace(secret, REDACTED)
            # An override list item, or ``override_dirname``'s comma-joined overrides.
            return ",".join(redact_argv(value.split(","), secrets=secrets)) if "=" in value else redact_secrets(value)
        return value

    return clean(tree)


def redact_yaml_file(path: str, secrets: Iterable[str] = ()) -> bool:
    """Rewrite the YAML file at ``path`` redacted, if it holds a secret; returns whether it did."""
    import yaml

    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as handle:
        tree = yaml.safe_load(handle)
    redacted = redact_tree(tree, secrets)
    if redacted == tree:
        return False
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        yaml.safe_dump(redacted, handle, sort_keys=False, default_flow_style=False, allow_unicode=True)
    os.replace(temporary, path)
    return True


def redact_hydra_files(config: Any, run_dir: str, output_subdir: str | None, sweep_dir: str | None = None) -> None:
    """Redact the files Hydra wrote for this job (and the sweep's ``multirun.yaml``)."""
    secrets = secret_values(config)
    if output_subdir is not None:
        for name in HYDRA_FILES:
            redact_yaml_file(os.path.join(run_dir, output_subdir, name), secrets)
    if sweep_dir is not None:
        redact_yaml_file(os.path.join(sweep_dir, "multirun.yaml"), secrets)
