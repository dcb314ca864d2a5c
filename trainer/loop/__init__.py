"""One rank's run: set-up and the training loop (``rank_run.py``), one optimizer step
(``train_step.py``; the pipeline's micro-batches: ``pipeline_micro_batches.py``; manual optimization:
``manual_step.py``), how losses become the global batch's gradient (``loss_normalization.py``,
``token_weights.py``, ``step_accounting.py``), what ``self.log`` collected and its reduction
(``log_collector.py``, ``log_reduction.py``, ``log_aggregates.py``), when a run stops (``step_limits.py``, ``run_limits.py``, ``stream_limits.py``), validation
(``validation.py``, ``sanity_check.py``), test and predict (``evaluation.py``), resume
(``resume.py``), the batch-size finder (``batch_size_finder.py``, ``batch_size_trial.py``) and what
the caller gets back (``weights_return.py``). Only the facade (``trainer.trainer``, the tools)
imports this package; everything else sees a run through `RunView`.
"""
