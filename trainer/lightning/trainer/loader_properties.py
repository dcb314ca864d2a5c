"""Lightning's Trainer properties about the data of the current (or last) call: the loaders the data
hooks returned and this rank's batch counts of the test / predict passes."""

from __future__ import annotations

from typing import Any


class LoaderProperties:
    """``train_dataloader``, ``val_dataloaders``, ``test_dataloaders``, ``predict_dataloaders`` (what the
    stage's hook or the entry point's argument gave: one DataLoader, or the list / dict of several;
    None before a call read them), ``num_test_batches`` / ``num_predict_batches`` (this rank's batches
    per loader) and ``enable_validation``. Read while a call runs and after it, in the process that
    ran it (spawned workers' loaders stay in the workers)."""

    def _data_record(self) -> tuple[dict[str, Any], dict[str, list[int]], bool]:
        view = self.__dict__.get("_run_view")
        if view is not None:
            return view.returned_loaders, view.num_eval_batches, view.has_validation
        return self.__dict__.get("_last_loaders", ({}, {}, False))

    @property
    def train_dataloader(self) -> Any:
        """The training DataLoader of the current or last fit (None before one)."""
        return self._data_record()[0].get("train")

    @property
    def val_dataloaders(self) -> Any:
        """The validation DataLoader(s) of the current or last call."""
        return self._data_record()[0].get("val")

    @property
    def test_dataloaders(self) -> Any:
        """The test DataLoader(s) of the current or last call."""
        return self._data_record()[0].get("test")

    @property
    def predict_dataloaders(self) -> Any:
        """The predict DataLoader(s) of the current or last call."""
        return self._data_record()[0].get("predict")

    @property
    def num_test_batches(self) -> list[int]:
        """This rank's batches per test loader (after the limits; [] before a test)."""
        return list(self._data_record()[1].get("test", []))

    @property
    def num_predict_batches(self) -> list[int]:
        """This rank's batches per predict loader (after the limits; [] before a predict)."""
        return list(self._data_record()[1].get("predict", []))

    @property
    def enable_validation(self) -> bool:
        """Whether the current or last fit validates: it has validation data and ``limit_val_batches`` is not 0."""
        limit = getattr(self, "limit_val_batches", None)
        return bool(self._data_record()[2]) and not (limit is not None and limit == 0)
