"""Exact retrieval over embeddings: blocked top-k search on device (search.py), the
metrics retrieval and STS work report (metrics.py), the evaluators that embed a BEIR-format
set or scored pairs with any embedding function (evaluate.py), and hard-negative mining
(mining.py). Every piece takes `embed(texts) -> [N, D]`; which model embeds is the caller's
(jaxencoder.load(...).embed, or a training run's params: train/embedding_evals.py)."""
