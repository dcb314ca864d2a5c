"""Lightning's ``lightning.fabric.utilities``: ``imports.py`` (platform flags), ``seed.py``
(``seed_everything``), ``rank_zero.py`` (the rank-zero helpers)."""
