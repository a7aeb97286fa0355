"""A retrieval embedding model from all-MiniLM-L6-v2: a Shakespeare speech's first half is
the query, its second half the document (InfoNCE, mean pooling, no projection head: the
pooled vectors are what retrieval and sentence-transformers use).

  python train.py --config configs/retrieval_minilm.py --workdir runs/retrieval

Data: `shakespeare_halves` (each train speech of shakespeare_speeches cut in two halves of
its words, made on first use). Each eval also scores `shakespeare_retrieval` (the 1,000
held-out test speeches: first halves ranking all 1,000 second halves; ndcg@10, mrr@10,
recall@100 in the eval rows; fetched on first use). Nothing is chosen on that set: the
runs are read at their last step. The three arms of the measured recipe (docs/results.md,
"An embedding recipe"), 100 steps each, 32 pairs a step:
  in-batch negatives only: this config, --workdir runs/inbatch
  + one mined hard negative a row (MiniLM's nearest train second half below the margin):
    jaxencoder-data mine shakespeare_halves --data-dir data --model minilm \\
      --name shakespeare_halves_mined --k 1
    ... --workdir runs/mined --config.data.source=text_records/shakespeare_halves_mined
  GradCache at 4x the batch (128 pairs a step, each ranked against all 128, at 32 pairs'
  activation memory): ... --workdir runs/gradcache --config.optim.grad_accum_steps=4
  python bench/embedding_recipe.py minilm inbatch=runs/inbatch@100 mined=runs/mined@100 \\
    gradcache=runs/gradcache@100
Measured 2026-12-05 on the 2-core CPU machine, the three runs side by side (load 7-10; 14,
18 and 27 min wall; in-batch 2.6 s a step at first, beside the mining only), seed 0, one
run each; mining took 3.4 min (11,999 of 12,000 rows kept). shakespeare_retrieval, 1,000
queries x 1,000 documents:
                    ndcg@10  mrr@10  recall@100
  MiniLM            0.1103   0.0935  0.4430
  in-batch          0.1354   0.1115  0.5980
  + mined negative  0.1368   0.1164  0.5990
  GradCache 4x      0.1548   0.1264  0.6640
  GradCache 4x, 25 steps  0.1218   0.1045  0.5240  (as many pairs as in-batch)
ndcg@10 differences, 95% paired bootstrap over the queries (10,000 resamplings):
  in-batch - MiniLM          +0.0250 [+0.0131, +0.0376]
  mined - in-batch           +0.0014 [-0.0057, +0.0086]   (no measurable gain)
  GradCache 4x - in-batch    +0.0194 [+0.0120, +0.0269]
  GradCache 4x - mined       +0.0180 [+0.0102, +0.0262]
  GradCache 25 - in-batch    -0.0136 [-0.0216, -0.0057]
The intervals cover the choice of queries, not the training seed (one run per arm).
GradCache's run saw 4x the pairs in its 100 steps (12,800 against 3,200): at equal steps
the larger batch wins; with as many pairs as in-batch (25 steps) it loses, at the same
learning rate. docs/results.md, "An embedding recipe".
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="ndcg@10", values=(0.1354,), spread=0.015)  # one seed: a guess


def get_config():
  config = base_config()
  config.task = "contrastive"
  config.init_from = "minilm"
  config.model.pooling = "mean"
  config.projection_dim = 0
  config.data.kind = "text_records"
  config.data.source = "shakespeare_halves"
  config.data.eval_split = ""  # eval: 1 in 10 train examples (validation)
  config.data.holdout_every = 10
  config.data.seq_len = 32
  config.eval_retrieval = "shakespeare_retrieval"  # fetched into data/ on first use
  config.batch_size = 32
  config.eval_batch_size = 64
  config.num_train_steps = 100
  config.log_every = 10
  config.eval_every = 50
  config.checkpoint_every = 50
  config.temperature = 0.05
  config.optim.learning_rate = 3e-5
  config.optim.warmup_steps = 10
  return config
