"""Training: tasks, optimizer, sharding, the jitted steps and the loop.

`train_and_evaluate(config, workdir)` is what `train.py` and notebooks call.
"""

from jaxencoder.train.loop import train_and_evaluate

__all__ = ["train_and_evaluate"]
