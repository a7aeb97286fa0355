"""Span extraction: the character a Shakespeare passage names (start/end logits per token).

  python train.py --config configs/span.py --workdir runs/span

Data: `shakespeare_span` (jaxencoder/data/shakespeare_tasks.py), made from the fetched
plays on first use: a 1-3 line passage of a speech that names exactly one character of
its play; the answer is that name. Held-out speeches for eval. A tiny 2-layer BERT from
scratch; `--config.init_from=RUN_DIR` starts from a checkpoint instead.
Measured (2026-12-01, 2 shared CPU cores, ~6 min): train loss 2.81 (steps 1-25) ->
0.052 (276-300); eval exact match 95.8%, span F1 0.967 (most frequent span: 1.5%).
README "Heads and tasks".
The checkpoint is chosen on a validation part of train (1 in 10 train examples,
`data.holdout_every`; by position, the same for every seed, saved with the run's config) and
the test split is scored once at the end with it (`data.test_split`: test_* metrics, a
`test` row in metrics.jsonl). The numbers above were measured before that, with eval on test
and every train example trained on. With it (2026-12-05, `python bench/results.py span`,
seed 0, 2 CPU cores): test exact match 94.5% (95.8% before), 48 s at load 2.9; RESULT
declares it (one seed: its spread is a guess).
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="test_accuracy", values=(0.9451,), spread=0.02)  # exact match


def get_config():
  config = base_config()
  config.task = "span"
  config.data.kind = "text_records"
  config.data.source = "shakespeare_span"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.test_split = "test"  # scored once, with the best checkpoint
  config.data.seq_len = 64
  config.batch_size = 32
  config.num_train_steps = 300
  config.log_every = 25
  config.eval_every = 100
  config.checkpoint_every = 100
  config.best_metric = "span_f1"
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 30
  return config
