"""Tiny BERT with MLM + sentence-order prediction (ALBERT's SOP) on the offline
Shakespeare text: rows are two consecutive speeches, swapped half the time.

  python train.py --config configs/mlm_sop_tiny.py --workdir runs/mlm_sop_tiny
  # next-sentence prediction (BERT's NSP) instead: --config.sentence_pair=nsp

As configs/mlm_tiny.py plus BERT's pooler (pooler_dense) under the 2-way pair head;
padded rows (one pair per row: packing is refused). Eval metrics: pair_accuracy
(chance 0.5), pair_loss, mlm_loss, accuracy (MLM).
Measured (2026-12-01, 2 shared CPU cores, ~3 s/step): SOP, 120 steps
(--config.num_train_steps=120 --config.log_every=20): train loss 10.78 -> 7.18, eval pair
accuracy 0.493 (chance), MLM loss 6.53; NSP, 300 steps: 10.63 -> 7.02, pair accuracy
0.493 (chance), MLM loss 6.34. The pair head needs longer runs than these.
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="mlm_loss", values=(6.53,), spread=0.1,
              overrides=("num_train_steps=120", "log_every=20"))


def get_config():
  config = base_config()
  config.task = "mlm"
  config.sentence_pair = "sop"
  config.model.pooler_dense = True
  config.num_train_steps = 300
  config.log_every = 25
  config.eval_every = 150
  config.checkpoint_every = 50
  config.batch_size = 32
  config.eval_batch_size = 64
  config.data.seq_len = 128
  config.data.holdout_every = 50
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 30
  return config
