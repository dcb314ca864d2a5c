"""The built-in Hydra configs (``config.yaml`` and its groups), installed as ``trainer/conf``.

A package so that Hydra (``pkg://trainer.conf``) and ``importlib.resources`` find the yaml files the
same way in a wheel and in an editable install; it holds no code.
"""
