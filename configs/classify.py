"""Fine-tune a sequence classifier from an MLM checkpoint (or from scratch).

  python train.py --config configs/classify.py --workdir runs/classify \\
      --config.data.source=DIR --config.init_from=runs/default

`data.source` is a prepared text_classification dataset (CSV/TSV with text,
optional text_b, label: `python -m jaxencoder.data prepare text_classification
--source FILES --data-dir data --name NAME`, then source=text_classification/NAME).
Layer-wise LR decay 0.8; the encoder comes from `init_from` when given.
Not measured on real data yet.
"""

from jaxencoder.train.config import base_config


def get_config():
  config = base_config()
  config.task = "classify"
  config.data.kind = "text_classification"
  config.data.source = "text_classification/default"
  config.data.eval_split = "test"
  config.data.seq_len = 128
  config.batch_size = 32
  config.num_train_steps = 500
  config.log_every = 25
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "accuracy"
  config.optim.learning_rate = 5e-4
  config.optim.warmup_steps = 50
  config.optim.layer_decay = 0.8
  return config
