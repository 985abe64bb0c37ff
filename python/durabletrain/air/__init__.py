"""Ray AIR's integrations, over durabletrain (``ray.air`` → ``durabletrain.air``).

Only :mod:`durabletrain.air.integrations.mlflow` is here: Ray's
``MLflowLoggerCallback``, which the run's workflow carries out.
"""
