"""``TQDMProgressBar``: Lightning's tqdm bar callback. This trainer draws its own tqdm bar on rank 0
(``Trainer(progress_bar=True)``; the default shows it when stderr is a terminal), so this callback
only says which of its settings the trainer's bar does not take: they change how the run is shown,
never what it trains."""

from __future__ import annotations

import logging

from trainer.api.callback import Callback
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


class TQDMProgressBar(Callback):
    """Accepted in ``callbacks=``; the bar is the trainer's own (refreshed every step, left on screen)."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        ignored = {name: value for name, value, default in (
            ("refresh_rate", refresh_rate, 1), ("process_position", process_position, 0), ("leave", leave, False))
            if value != default}
        if ignored:
            settings = ", ".join(f"{name}={value!r}" for name, value in ignored.items())
            rank_zero_warn(log, "TQDMProgressBar(%s) is ignored: the trainer draws its own bar on rank 0 "
                           "(Trainer(progress_bar=True / False))", settings)
        self.refresh_rate, self.process_position, self.leave = refresh_rate, process_position, leave
