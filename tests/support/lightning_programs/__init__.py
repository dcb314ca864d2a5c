"""Programs written in Lightning's documented idioms, importing only ``lightning`` / ``torchmetrics`` /
``torch`` (and the test tracer). Each runs under Lightning as it stands, and under this trainer with
its import lines rewritten (tests/support/lightning_rewrite.py); tests/support/lightning_oracle.py
compares the two."""
