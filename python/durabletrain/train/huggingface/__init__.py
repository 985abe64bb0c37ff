"""Ray Train's Hugging Face integrations over durabletrain (``ray.train.huggingface`` → ``durabletrain.train.huggingface``):
``durabletrain.train.huggingface.transformers``."""
