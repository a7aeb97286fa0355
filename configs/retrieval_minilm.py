"""A retrieval embedding model from all-MiniLM-L6-v2: a Shakespeare speech's first half is
the query, its second half the document (InfoNCE, mean pooling, no projection head: the
pooled vectors are what retrieval and sentence-transformers use).

  python train.py --config configs/retrieval_minilm.py --workdir runs/retrieval

Data: `shakespeare_halves` (each train speech of shakespeare_speeches cut in two halves of
its words, made on first use). Each eval also scores `shakespeare_retrieval` (the 1,000
held-out test speeches: first halves ranking all 1,000 second halves; ndcg@10, mrr@10,
recall@100 in the eval rows; fetched on first use); the checkpoint is chosen on the
validation loss, never on that set. The three arms of the measured recipe
(docs/results.md, "Embedding recipe"), 100 steps each:
  in-batch negatives only          (this config; 32 rows a step)
  + one mined hard negative a row  jaxencoder-data mine shakespeare_halves --data-dir data \\
                                     --model minilm --name shakespeare_halves_mined --k 1
                                   --config.data.source=text_records/shakespeare_halves_mined
  GradCache at 4x the batch        --config.optim.grad_accum_steps=4 (128 rows a step, every
                                   row ranked against all 128, at 32 rows' activation memory)
  python bench/embedding_recipe.py --runs runs/inbatch runs/mined runs/gradcache
    (ndcg@10 per query on shakespeare_retrieval, paired bootstrap interval per difference)
"""

from jaxencoder.train.config import base_config

UNSCORED = "placeholder"


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
