"""What the ``trainer`` command takes from the directory it runs in (a project of one's own).

- The directory is on ``sys.path``, as under ``python -m``: the project's modules import by name in
  the command, in the workers it spawns (they start with this ``sys.path``) and in Hydra's
  ``_target_`` lookups, with no ``PYTHONPATH``.
- Its ``conf/`` (when there is one) is searched before the built-in configs: the project's groups and
  options compose with the built-in ones (``recipe=my_project strategy=fsdp``) and a file of the same
  name as a built-in one (``strategy/fsdp.yaml``) is the project's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

from trainer.runtime.config_dir import builtin_config_dir

PROJECT_CONF = "conf"


def project_conf_dir(cwd: str | None = None) -> Path | None:
    """``<cwd>/conf`` when it is a directory other than the built-in one (a checkout's ``conf/``)."""
    conf = Path(cwd or os.getcwd()) / PROJECT_CONF
    if not conf.is_dir() or conf.resolve() == builtin_config_dir().resolve():
        return None
    return conf.resolve()


class ProjectConfigs(SearchPathPlugin):
    """Puts the working directory's ``conf/`` on Hydra's search path, ahead of the primary configs."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        conf = project_conf_dir()
        if conf is not None:
            search_path.prepend(provider="project", path=f"file://{conf}", anchor=SearchPathQuery(provider="main"))


def use_project_dir() -> None:
    """Make the working directory's modules and ``conf/`` visible (see the module's docstring)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    Plugins.instance().register(ProjectConfigs)
