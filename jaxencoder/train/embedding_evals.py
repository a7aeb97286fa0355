"""eval_retrieval / eval_sts: retrieval (ndcg@10, mrr@10, recall@100) and STS (spearman)
metrics in every eval row of an embedding run, which best_metric can pick.

The run's params embed the texts as `jaxencoder.load(RUN).embed` embeds with that
checkpoint (its Encoder's pooled vectors, L2-normalised, cut at data.seq_len tokens), so
a step's metrics here are `jaxencoder-eval --model RUN@STEP`'s. The files are read when
the run starts: a bad one stops it before any step (train/config.py checks the task
embeds text). eval_retrieval may name a fetchable set (`shakespeare_retrieval`): it is
fetched into data.data_dir on first use.
"""

from __future__ import annotations

import ml_collections

from jaxencoder.data import fetch
from jaxencoder.model.encoder import ENCODER
from jaxencoder.pretrained import sentences
from jaxencoder.retrieval.evaluate import Embed, Evaluators
from jaxencoder.tokenizer import Tokenizer


def from_config(config: ml_collections.ConfigDict) -> Evaluators | None:
  """The run's evaluators (None without eval_retrieval or eval_sts)."""
  retrieval = config.get("eval_retrieval", "")
  if retrieval in fetch.SOURCES:
    retrieval = str(fetch.fetch(retrieval, config.data.data_dir))
  found = Evaluators.read(retrieval, config.get("eval_sts", ""))
  return found or None


def embedder(config: ml_collections.ConfigDict, cfg, params, tokenizer: Tokenizer) -> Embed:
  """`embed(texts) -> [N, D]` of the run's encoder `params` (the state's, any sharding)."""
  sentence = sentences.SentenceConfig(max_seq_length=config.data.seq_len, pooling=cfg.pooling,
                                      normalize=True)
  return lambda texts: sentences.embed_with(texts, (cfg, params[ENCODER], tokenizer), sentence,
                                            batch_size=config.eval_batch_size, progress=False)
