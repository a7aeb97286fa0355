"""Contrastive sentence embeddings from all-MiniLM-L6-v2 (SimCSE's InfoNCE): a speech's first
half is the positive of its second half, the batch's other halves its negatives.

  python train.py --config configs/contrastive.py --workdir runs/simcse
  python bench/baselines_text.py --simcse runs/simcse   # held-out retrieval, before/after

Data: `shakespeare_speeches` (speeches of >= 8 words, fetched and made on first use; 1 in
10 speeches is test, by a hash of play and speech number), each cut at the word nearest
its middle (`data.views=halves`, data/span_views.py: adjacent spans as positives, as in
DeCLUTR). `--config.data.views=dropout` is unsupervised SimCSE proper (the text twice,
two dropout masks) on the same speeches.
train.py's eval: recall@1 of each held-out speech's second half among its eval batch's 64.
The bench measures two held-out retrievals with the encoder's mean-pooled output (the
projection head is for training only), before (MiniLM itself) and after: each test
speech's first half ranking all 1,000 test second halves, and each `shakespeare_pairs`
test line ranking 2,000 candidates (the 1,000 next lines, 1,000 hard negatives).
Measured 2026-12-01 on the 2-core CPU machine, idle: 100 steps, 4 min 30 s wall (2.4-2.8 s a
step, conversion of MiniLM and the data made on first use included); then
`python bench/baselines_text.py --simcse runs/simcse runs/simcse_dropout` (97 s),
recall@1 / recall@5 / MRR:
  held-out second halves (1,000 test speeches)  MiniLM 0.060 / 0.111 / 0.095
                                                 after  0.080 / 0.172 / 0.134
                                                 TF-IDF 0.049 / 0.084 / 0.076
  next line (shakespeare_pairs test)            MiniLM 0.023 / 0.053 / 0.043
                                                 after  0.020 / 0.056 / 0.043 (no change)
train.py's eval (second half among 64, test speeches): recall@1 0.229, MRR 0.382.
With views=dropout (SimCSE proper; --workdir runs/simcse_dropout), same speeches and
steps: halves 0.058 / 0.113 / 0.094, next line 0.025 / 0.055 / 0.044, i.e. no change
from MiniLM: its two dropout views of a text are matched from step 10 on (loss 5e-4, then
2e-5), so there is nothing to learn.
Matryoshka (README "Matryoshka embeddings"): the loss on the pooled vectors themselves (no
head, so training shapes what retrieval uses), summed over their first 384/256/128/64 dims,
each re-normalised:
  python train.py --config configs/contrastive.py --workdir runs/mrl \\
    --config.projection_dim=0 --config.matryoshka_dims=384,256,128,64
  python bench/baselines_text.py --simcse runs/mrl --dims 384,256,128,64
against the same without it (`--config.matryoshka_weights=1,0,0,0`: trained on all 384,
every size reported). Measured 2026-12-04, 2 shared CPU cores, 100 steps each (10.6 / 10.9
min wall, 5.5 s a step under load), bench 2 min; held-out second halves R@1 / MRR at
384 / 256 / 128 / 64 dims:
  MiniLM      0.060 / 0.095   0.054 / 0.091   0.049 / 0.079   0.035 / 0.061
  no MRL      0.086 / 0.135   0.082 / 0.130   0.055 / 0.098   0.035 / 0.074
  Matryoshka  0.086 / 0.138   0.076 / 0.130   0.055 / 0.107   0.044 / 0.085
train.py's eval (among 64) MRR: no MRL 0.392 / 0.380 / 0.327 / 0.283, Matryoshka 0.390 /
0.386 / 0.357 / 0.321. One seed; the 64-dim gain is small (see docs/results.md).
The checkpoint is chosen on a validation part of train (1 in 10 train examples,
`data.holdout_every`; by position, the same for every seed, saved with the run's config) and
the test split is scored once at the end with it (`data.test_split`: test_* metrics, a
`test` row in metrics.jsonl). The numbers above were measured before that, with eval on test
and every train example trained on. With it (2026-12-05, `python bench/results.py
contrastive`, seed 0, 2 shared CPU cores): test recall@1 of a speech's second half among its
test batch's 64: 0.233 (not measured before: the bench's retrieval above is the documented
one), 6.1 min at load 4.2; RESULT declares it (one seed: its spread is a guess).
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="test_accuracy", values=(0.233,), spread=0.05)


def get_config():
  config = base_config()
  config.task = "contrastive"
  config.init_from = "minilm"
  config.model.pooling = "mean"
  config.data.kind = "text_records"
  config.data.source = "shakespeare_speeches"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.test_split = "test"  # scored once, with the best checkpoint
  config.data.views = "halves"
  config.data.seq_len = 32
  config.batch_size = 32
  config.eval_batch_size = 64
  config.num_train_steps = 100
  config.log_every = 10
  config.eval_every = 100
  config.checkpoint_every = 100
  config.temperature = 0.05
  config.optim.learning_rate = 3e-5
  config.optim.warmup_steps = 10
  return config
