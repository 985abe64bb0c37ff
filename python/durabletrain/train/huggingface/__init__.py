"""Ray Train's Hugging Face integrations over durabletrain (``ray.train.huggingface`` → ``durabletrain.train.huggingface``):
``durabletrain.train.huggingface.transformers``."""


def __getattr__(name):
    """``durabletrain.train.huggingface.transformers`` imports on first use
    (``import durabletrain as ray`` reaches ``ray.train.huggingface.transformers``)."""
    if name == "transformers":
        import importlib
        return importlib.import_module("durabletrain.train.huggingface.transformers")
    raise AttributeError("module 'durabletrain.train.huggingface' has no attribute %r" % (name,))
