"""Multiple choice: the true next line of a Shakespeare speech among 4 lines of its play.

  python train.py --config configs/multiple_choice.py --workdir runs/choice

Data: `shakespeare_choice` (jaxencoder/data/shakespeare_tasks.py), made from the fetched
plays on first use: a line, its successor in the speech and 3 lines of other speeches of
the same play, shuffled. Each (line, choice) pair is encoded as [CLS] line [SEP] choice
[SEP] and scored by one linear unit on the pooled vector; softmax over the 4 scores.
Chance is 25%. A tiny 2-layer BERT from scratch.
Measured (2026-12-01, 2 shared CPU cores, ~5.5 min): train loss 1.390 (steps 1-25) ->
1.324 (276-300); eval accuracy 31.6% (chance 25%). README "Heads and tasks".
The checkpoint is chosen on a validation part of train (1 in 10 train examples,
`data.holdout_every`; by position, the same for every seed, saved with the run's config) and
the test split is scored once at the end with it (`data.test_split`: test_* metrics, a
`test` row in metrics.jsonl). The numbers above were measured before that, with eval on test
and every train example trained on. With it (2026-12-05, `python bench/results.py
multiple_choice`, seed 0, 2 shared CPU cores): test accuracy 29.4% (31.6% before; chance
25%), 3.0 min at load 4.6; RESULT declares it (one seed: its spread is a guess).
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="test_accuracy", values=(0.294,), spread=0.03)


def get_config():
  config = base_config()
  config.task = "multiple_choice"
  config.data.kind = "text_records"
  config.data.source = "shakespeare_choice"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.test_split = "test"  # scored once, with the best checkpoint
  config.data.seq_len = 48
  config.batch_size = 16
  config.eval_batch_size = 50
  config.num_train_steps = 300
  config.log_every = 25
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "accuracy"
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 30
  return config
