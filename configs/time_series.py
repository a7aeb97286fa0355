"""Time-series classification on a UCR/UEA set (default: GunPoint, 150 steps, 1 channel).

  python train.py --config configs/time_series.py --workdir runs/gunpoint

The UCR archive ships in the aeon wheel (fetched via pip, files read directly).
Not measured yet.
"""

from jaxencoder.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config


def get_config():
  config = base_config()
  config.task = "classify"
  config.model = model_config(EncoderConfig.preset(
      "tiny", input_kind="series", input_features=1, type_vocab_size=0, max_len=512,
      pooling="mean"))
  config.data.kind = "time_series"
  config.data.source = "time_series/gunpoint"
  config.data.eval_split = "test"
  config.data.seq_len = 150
  config.batch_size = 16
  config.eval_batch_size = 50
  config.num_train_steps = 500
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "accuracy"
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 50
  return config
