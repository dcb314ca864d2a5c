"""Lightning's ``lightning.pytorch.cli``: ``cli_lightning_logo``; the rest of Lightning's command-line
layer (``LightningCLI`` ...) is an ImportError saying what to use."""

from trainer.lightning._missing import missing_names


def cli_lightning_logo() -> None:
    """Lightning prints its logo here; this trainer prints nothing (a program that calls it runs as is)."""


_HYDRA = "the `trainer` command line (Hydra: trainer fit model=... data=...) or trainer.lightning.Trainer in a script"
__getattr__ = missing_names(__name__, {
    "LightningCLI": _HYDRA, "LightningArgumentParser": _HYDRA, "SaveConfigCallback": _HYDRA,
    "instantiate_class": "hydra.utils.instantiate", "instantiate_module": "hydra.utils.instantiate",
})

__all__ = ["cli_lightning_logo"]
