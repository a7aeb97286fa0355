"""Regression: when was this play written? From one speech, (year - 1600) / 10 by MSE.

  python train.py --config configs/regression.py --workdir runs/regression

Data: `shakespeare_regression` (jaxencoder/data/shakespeare_tasks.py), made from the
fetched plays on first use: a speech's first 60 words; the target is its play's
usual date of writing (1590-1613, uncertain by a year or two) in decades from 1600.
Eval: MSE (the loss), Pearson and Spearman (over every eval prediction) on held-out
speeches of the same 37 plays. A tiny 2-layer BERT from scratch.
Measured (2026-12-01, 2 shared CPU cores, ~7 min): train MSE 0.426 (steps 1-25) ->
0.348 (276-300); eval MSE 0.381 (train mean: 0.393), Pearson 0.350, Spearman 0.348.
README "Heads and tasks".
The checkpoint is chosen on a validation part of train (1 in 10 train examples,
`data.holdout_every`; by position, the same for every seed, saved with the run's config) and
the test split is scored once at the end with it (`data.test_split`: test_* metrics, a
`test` row in metrics.jsonl). The numbers above were measured before that, with eval on test
and every train example trained on. With it (2026-12-05, `python bench/results.py
regression`, seed 0, 2 shared CPU cores): test Spearman 0.3671 (0.348 before), 2.7 min at
load 4.7; RESULT declares it (one seed: its spread is a guess).
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="test_spearman", values=(0.3671,), spread=0.05)


def get_config():
  config = base_config()
  config.task = "regression"
  config.model.pooling = "max"
  config.data.kind = "text_records"
  config.data.source = "shakespeare_regression"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.test_split = "test"  # scored once, with the best checkpoint
  config.data.seq_len = 96
  config.batch_size = 32
  config.num_train_steps = 300
  config.log_every = 25
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "spearman"
  config.optim.learning_rate = 2e-3
  config.optim.warmup_steps = 30
  return config
