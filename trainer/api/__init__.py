"""What users touch: ``TrainModule`` (``module.py``) and its methods (``log_methods.py``: ``self.log``;
``hparams.py``: ``save_hyperparameters`` (``hparams_display.py``: how loggers show them;
``hparams_archive.py``: the objects among them pickled for checkpoints); ``run_state.py``: ``global_step``
and Lightning's other run properties; ``manual_optimization.py``: ``self.optimizers()``,
``toggle_optimizer`` ...; ``optimizer.py``: ``LightningOptimizer``, what ``self.optimizers()`` returns;
``hook_table.py``: every hook, who receives it, in which order), ``DataModule`` (``datamodule.py``),
``Callback`` (``callback.py``) with the read-only
`RunView` it reads a run through (``run_view.py``), the checks of the
Trainer's plain arguments (``trainer_arguments.py``), Lightning's names (``lightning_names.py``) and
the hooks the trainer refuses (``lightning_hooks.py``). Imports only ``trainer.runtime``.
"""
