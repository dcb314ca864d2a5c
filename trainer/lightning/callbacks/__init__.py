"""Lightning's ``lightning.pytorch.callbacks``: ``Callback``, and with Lightning's arguments
``EarlyStopping`` (``early_stopping.py``), ``LearningRateMonitor`` (``lr_monitor.py``), ``Timer``
(``timer.py``), ``ModelCheckpoint`` (``model_checkpoint.py``), ``ProgressBar`` and ``TQDMProgressBar`` (``progress.py``),
``BasePredictionWriter`` (``prediction_writer.py``); the
modules are named as Lightning's. The other Lightning callbacks are an ImportError saying what to use."""

from trainer.api.callback import Callback
from trainer.lightning._missing import missing_names
from trainer.lightning.callbacks.early_stopping import EarlyStopping
from trainer.lightning.callbacks.lr_monitor import LearningRateMonitor
from trainer.lightning.callbacks.model_checkpoint import ModelCheckpoint
from trainer.lightning.callbacks.prediction_writer import BasePredictionWriter
from trainer.lightning.callbacks.progress import ProgressBar, TQDMProgressBar
from trainer.lightning.callbacks.timer import Timer

_MISSING = {
    "BackboneFinetuning": "a Callback of your own that freezes / unfreezes parameters (requires_grad_)",
    "BaseFinetuning": "a Callback of your own that freezes / unfreezes parameters (requires_grad_)",
    "BatchSizeFinder": "Trainer(auto_batch_size=True, ...) (trainer/loop/batch_size_finder.py)",
    "Checkpoint": "trainer.lightning.callbacks.ModelCheckpoint",
    "DeviceStatsMonitor": "Trainer(profile={'wall_clock_breakdown': True}) and the perf/ metrics the trainer logs",
    "EMAWeightAveraging": "torch.optim.swa_utils.AveragedModel in a Callback of your own",
    "GradientAccumulationScheduler": "Trainer(accumulate_grad_batches=N) (one value for the whole run)",
    "LambdaCallback": "a subclass of trainer.lightning.Callback with the hooks you need",
    "LearningRateFinder": "nothing: this trainer has no learning-rate finder; try a few values",
    "ModelPruning": "torch.nn.utils.prune in a Callback of your own",
    "ModelSummary": "Trainer(enable_model_summary=True)",
    "OnExceptionCheckpoint": "Trainer(checkpoint=...) (a preempted run saves before it stops)",
    "RichModelSummary": "Trainer(enable_model_summary=True)",
    "RichProgressBar": "Trainer(progress_bar=True) (a tqdm bar on rank 0)",
    "SpikeDetection": "Trainer(nonfinite_loss='error') for NaN / inf losses",
    "StochasticWeightAveraging": "torch.optim.swa_utils.AveragedModel in a Callback of your own",
    "ThroughputMonitor": "the perf/ metrics the trainer logs (samples/s, tokens/s, MFU)",
    "WeightAveraging": "torch.optim.swa_utils.AveragedModel in a Callback of your own",
}

__all__ = ["BasePredictionWriter", "Callback", "EarlyStopping", "LearningRateMonitor", "ModelCheckpoint", "ProgressBar",
           "TQDMProgressBar", "Timer"]

__getattr__ = missing_names(__name__, _MISSING)
