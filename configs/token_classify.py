"""Word-level tagging (e.g. POS) with labels on each word's first sub-word.

  python -m jaxencoder.data prepare tagged_tokens --source DIR --data-dir data --name pos
  python train.py --config configs/token_classify.py --workdir runs/pos \\
      --config.data.source=tagged_tokens/pos [--config.init_from=runs/default]

Not measured on real data yet.
"""

from jaxencoder.train.config import base_config


def get_config():
  config = base_config()
  config.task = "token_classify"
  config.data.kind = "tagged_tokens"
  config.data.source = "tagged_tokens/default"
  config.data.eval_split = ""
  config.data.holdout_every = 10
  config.data.seq_len = 64
  config.batch_size = 32
  config.num_train_steps = 500
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "accuracy"
  config.optim.learning_rate = 5e-4
  config.optim.warmup_steps = 50
  return config
