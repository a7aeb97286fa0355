"""Unsupervised SimCSE: two dropout views of each sentence are positives (InfoNCE).

  python train.py --config configs/contrastive.py --workdir runs/simcse \\
      [--config.init_from=runs/default]

Not measured yet.
"""

from jaxencoder.train.config import base_config


def get_config():
  config = base_config()
  config.task = "contrastive"
  config.model.pooling = "mean"
  config.data.seq_len = 64
  config.batch_size = 64
  config.num_train_steps = 300
  config.eval_every = 100
  config.checkpoint_every = 100
  config.temperature = 0.05
  config.optim.learning_rate = 3e-4
  config.optim.warmup_steps = 30
  return config
