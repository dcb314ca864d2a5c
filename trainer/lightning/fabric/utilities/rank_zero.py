"""Lightning's ``lightning.fabric.utilities.rank_zero``: the rank-zero helpers."""

from trainer.lightning.utilities.rank_zero import (rank_zero_debug, rank_zero_deprecation, rank_zero_info,
                                                   rank_zero_only, rank_zero_warn)

__all__ = ["rank_zero_debug", "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn"]
