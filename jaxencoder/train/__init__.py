"""Training: tasks, optimizer, sharding, the jitted steps and the loop.

`train_and_evaluate(config, workdir)` is what `train.py` and notebooks call. It is
imported on first use, so the model-side modules (tasks, steps, optim, sharding) load
without the input pipeline's dependencies (grain, tensorflow-datasets).
"""

__all__ = ["train_and_evaluate"]


def __getattr__(name: str):
  if name == "train_and_evaluate":
    from jaxencoder.train.loop import train_and_evaluate  # lazy: tasks import without grain
    return train_and_evaluate
  raise AttributeError(f"module 'jaxencoder.train' has no attribute {name!r}")
