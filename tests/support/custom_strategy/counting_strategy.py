"""A strategy registered from outside the package (tests/unit/strategies/test_custom_strategy.py): one Python file
plus ``strategy/counting.yaml`` beside it. It trains as ``single`` and writes how many optimizer
steps went through it to ``record`` when the run ends, so a test can tell it was used."""

from __future__ import annotations

from trainer.strategies.single import SingleDeviceStrategy


class CountingStrategy(SingleDeviceStrategy):
    """``single`` that counts its optimizer steps and writes the count to ``record`` at teardown."""

    name = "counting"

    def __init__(self, accelerator: str = "auto", record: str | None = None):
        super().__init__(accelerator)
        if record is None:
            raise ValueError("strategy.record=null: give the file the step count is written to")
        self.record, self.steps = record, 0

    def optimizer_step(self, optimizer) -> None:
        self.steps += 1
        super().optimizer_step(optimizer)

    def teardown(self, clean: bool = True) -> None:
        with open(self.record, "w") as f:
            f.write(str(self.steps))
        super().teardown(clean)
