"""Ray Tune's searchers, by the module paths Ray programs import them from.

``from ray.tune.search.optuna import OptunaSearch`` becomes
``from durabletrain.tune.search.optuna import OptunaSearch``: Optuna's TPE,
which the search workflow runs itself (package tune on the Go side), so a
search that outlives its driver keeps its searcher's state in its history.
"""
