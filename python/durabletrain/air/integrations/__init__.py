"""Experiment trackers a run logs to (``ray.air.integrations`` → ``durabletrain.air.integrations``)."""
