"""A tiny ViT on Fashion-MNIST (28x28x1, 7x7 patches), fetched via apt.

  python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit

Not measured yet.
"""

from jaxencoder.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config


def get_config():
  config = base_config()
  config.task = "classify"
  config.model = model_config(EncoderConfig.preset(
      "tiny", input_kind="image", image_size=(28, 28), patch_size=7, num_channels=1,
      type_vocab_size=0, dropout_rate=0.0, attention_dropout_rate=0.0))
  config.num_classes = 10
  config.data.kind = "image_arrays"
  config.data.source = "fashion_mnist"
  config.data.eval_split = "test"
  config.batch_size = 128
  config.eval_batch_size = 500
  config.num_train_steps = 1000
  config.eval_every = 500
  config.checkpoint_every = 250
  config.best_metric = "accuracy"
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 100
  return config
