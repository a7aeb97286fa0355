"""ELECTRA-Small (Clark et al. 2020, table 6): a 12-layer / 256-wide / 4-head
discriminator and a 64-wide / 1-head generator, on the offline Shakespeare text.

  python train.py --config configs/electra_small.py --workdir runs/electra_small

The paper's shape except its factorised 128-wide embeddings (here the token table is
256 wide) and its 128 x 128-token batches for 1M steps; LR 5e-4 (the paper's 5e-4 with
10k warmup steps, scaled down to this run). About 17M parameters: on 2 CPU cores a
short run is all that fits (add --config.num_train_steps=N).
Measured (2026-12-01, 2 shared CPU cores, 15-20 s/step), 20 steps only
(--config.num_train_steps=20 --config.log_every=5): train loss 38.70 (steps 1-5) -> 29.89
(16-20); eval discriminator accuracy 0.8585 = "all original", generator loss 9.28.
"""

from jaxencoder.model.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config

RESULT = dict(metric="accuracy", values=(0.8585,), spread=0.005,
              overrides=("num_train_steps=20", "log_every=5"))


def get_config():
  config = base_config()
  config.task = "electra"
  config.model = model_config(EncoderConfig(vocab_size=30522, num_layers=12, emb_dim=256,
                                            num_heads=4, mlp_dim=1024))
  config.num_train_steps = 2000
  config.log_every = 25
  config.eval_every = 500
  config.checkpoint_every = 250
  config.batch_size = 32
  config.eval_batch_size = 64
  config.data.seq_len = 128
  config.data.holdout_every = 50
  config.optim.learning_rate = 5e-4
  config.optim.warmup_steps = 200
  return config
