"""What a task is: `Family` (everything about a family of tasks, one module each) and
`Task` (one built task: a model and its loss), with the sums every family shares.

Metrics are sums (e.g. `loss_sum`, `loss_weight`, `correct`), so evaluation over a whole
split is exact whatever the batching; a family's `summarize` turns them into values.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import kinds
# the batch-shape helpers the data kinds share with the task modules (which import them here)
from jaxencoder.data.kinds.base import Kind, Shapes, per_example, text_shapes  # noqa: F401
from jaxencoder.model.encoder import ENCODER, Encoder

if TYPE_CHECKING:  # the grain pipelines load only where a task builds one
  from jaxencoder.data.pipeline import Reading

INPUT_KEYS = {"text": "input_ids", "image": "images", "series": "inputs"}
MODEL_KWARGS = ("attention_mask", "token_type_ids", "segment_ids", "positions")
MASKED = -1e9  # logit of a position or candidate that may not be chosen
Sums = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Task:
  """A model and its loss. `loss_fn(params, batch, rng, train)` -> (loss, metric sums).

  A loss over the whole batch's embeddings (contrastive: in-batch negatives) comes in two
  halves as well: `embed_fn(params, batch, rng, train)` -> embeddings (arrays of rows
  [B, ...]) and `embedding_loss_fn(embeddings, batch)` -> (loss, metric sums), loss_fn
  their composition (`embedding_task`). Micro-batches then train exactly as one batch
  (steps.cached_gradients, GradCache)."""
  name: str
  model: nn.Module
  input_key: str
  loss_fn: Callable[..., tuple[jax.Array, Sums]]
  family: "Family"
  extra_keys: tuple[str, ...] = ()  # batch keys the model takes after MODEL_KWARGS (seq2seq)
  embed_fn: Callable[..., Any] | None = None
  embedding_loss_fn: Callable[..., tuple[jax.Array, Sums]] | None = None

  def example_batch(self, batch: dict[str, Any]) -> tuple:
    """The positional model inputs of a batch (for init)."""
    return model_args(batch, self.input_key) + tuple(batch[k] for k in self.extra_keys)

  def summarize(self, sums: dict[str, Any]) -> dict[str, float]:
    return self.family.summarize(self.name, sums)

  def metric_mode(self, metric: str) -> str:
    return self.family.metric_mode(metric)


@dataclasses.dataclass(frozen=True)
class Embedding:
  """How a task's loss compares the pooled vectors that embed and predict serve, for a
  sentence-transformers directory of its run (pretrained/sentences.py writes it).

  similarity: "cosine" (the loss L2-normalises them) or "dot" (it takes them as they are).
  nested_dims: the Matryoshka sizes the loss trains, widest first (empty: one size).
  """
  similarity: str = "cosine"
  nested_dims: tuple[int, ...] = ()


def embedding_task(name: str, model: nn.Module, input_key: str, family: "Family",
                   embed_fn: Callable[..., Any],
                   embedding_loss_fn: Callable[..., tuple[jax.Array, Sums]]) -> Task:
  """A Task whose loss is `embedding_loss_fn` of the batch's `embed_fn` embeddings."""
  def loss_fn(params, batch, rng, train):
    return embedding_loss_fn(embed_fn(params, batch, rng, train), batch)
  return Task(name, model, input_key, loss_fn, family, embed_fn=embed_fn,
              embedding_loss_fn=embedding_loss_fn)


class Family:
  """Everything about one family of tasks: its names, config options, model and loss,
  summary, metric directions, input pipeline, batch shapes and predictions.

  A new task is a subclass in its own module and one line in `registry.TASK_FAMILIES`.
  `name` below is always the resolved task name (`resolve`).
  """
  names: tuple[str, ...] = ()
  # Top-level training-config keys this family reads, with their defaults (a dict value
  # becomes a sub-config); train/config.base_config takes them from every family.
  options: dict[str, Any] = {}
  # Options that mean nothing to another family's tasks: set there, they are an error.
  exclusive: tuple[str, ...] = ()
  minimized: tuple[str, ...] = ()  # metrics beside the losses where lower is better
  # text_records columns each task needs (a task absent here does not read text_records).
  record_columns: dict[str, tuple[str, ...]] = {}
  # What jaxencoder-predict makes for each task: "lines" (one output line per input line),
  # "words" (the same, for lines of space-separated words) or pooled "vectors"; a task
  # absent here has no predictions.
  predicts: dict[str, str] = {}
  # Tasks whose predictions come with one score per class (jaxencoder-predict --scores).
  scored: tuple[str, ...] = ()
  # Tasks that learn the classes a dataset names: the fewest it must name (one class for a
  # softmax: loss 0 and accuracy 1 from the first step, nothing learnt).
  min_classes: dict[str, int] = {}

  def resolve(self, config) -> str:
    """The task to build from a config (ConfigDict or stored dict), options folded in."""
    return config["task"]

  def check(self, name: str, config) -> None:
    """Raises ValueError for options or data this task cannot take."""

  def finalize(self, name: str, config) -> None:
    """Sets the config's derived option values (train/config.finalize, before the lock)."""

  def task_options(self, name: str, config) -> dict[str, Any]:
    """The keyword options `build` takes, read from a config (an older stored config
    lacking one: its default)."""
    return {}

  def build(self, name: str, cfg: EncoderConfig, *, num_classes: int, **options) -> Task:
    raise NotImplementedError

  def summarize(self, name: str, sums: dict[str, Any]) -> dict[str, float]:
    return loss_summary(sums)

  def metric_mode(self, metric: str) -> str:
    """'min' for a loss (`loss`, `*_loss`), `dropped_predictions` and the family's
    `minimized` metrics; 'max' for the rest (accuracy, F1, MRR, correlations)."""
    lower = metric in ("loss", "dropped_predictions", *self.minimized) or metric.endswith("_loss")
    return "min" if lower else "max"

  def pipeline(self, name: str, config, source, tokenizer, *, train: bool, batch_size: int,
               read: Reading, kind: Kind, features: Callable[[dict], dict] | None = None):
    """The input pipeline of `batch_size` rows read as `read` says; by default the data
    kind's (`kind.pipeline`; `features`: this task's arrays of each example of a
    `records` kind, made by `record_features`)."""
    return kind.pipeline(config, tokenizer, source, train=train, batch_size=batch_size,
                         read=read, features=features)

  def stores_token_ids(self, name: str, config) -> bool:
    """Whether a text_corpus is read as stored token ids (data/token_ids.py): by default
    when data.tokenize_once asks for them."""
    return kinds.kind_of(config.data.kind).corpus and config.data.tokenize_once

  def record_features(self, name: str, tokenizer, seq_len: int, *,
                      num_labels: int | None) -> Callable[[dict], dict]:
    """A text_records example -> this task's arrays (data/records.py helpers)."""
    raise NotImplementedError

  def batch_shapes(self, name: str, config, batch: int, *, train: bool, group: int | None,
                   kind: Kind) -> Shapes | None:
    """{key: (shape, dtype)} of a batch where the task decides them; None: the data
    kind's (`kind.batch_shapes`, train/batch_shapes.py)."""
    return None

  def init_inputs(self, name: str) -> tuple | None:
    """Model inputs for an abstract init beyond (ids, mask) (None: those two)."""
    return None

  def predict(self, name: str, predictor, batch: dict[str, np.ndarray], args: tuple,
              lines: list[str]):
    """Output lines (`predicts` "lines" / "words") or pooled vectors [N, D] ("vectors")."""
    raise NotImplementedError

  def embedding(self, name: str, config) -> Embedding | None:
    """How the task's loss compares the pooled vectors (a stored config dict or
    ConfigDict); None: the task does not train sentence embeddings."""
    return None

  def scores(self, name: str, predictor, args: tuple) -> np.ndarray:
    """[B, C] one score per class of a batch (tasks in `scored`)."""
    raise NotImplementedError


def model_args(batch: dict[str, Any], input_key: str) -> tuple:
  return (batch[input_key],) + tuple(batch.get(k) for k in MODEL_KWARGS)


def apply_model(task_model, params, batch, input_key, rng, train, **kwargs):
  rngs = {"dropout": rng} if train else {}
  return task_model.apply({"params": params}, *model_args(batch, input_key),
                          deterministic=not train, rngs=rngs, **kwargs)


def mean_loss(sums: Sums) -> jax.Array:
  return sums["loss_sum"] / jnp.maximum(sums["loss_weight"], 1.0)


def weighted_ce(logits, labels, weights) -> Sums:
  """Sums of cross-entropy, weight and correct top-1 guesses (a tie with the label counts)."""
  return weighted_sums(*token_ce(logits, labels), weights)


def token_ce(logits, labels) -> tuple[jax.Array, jax.Array]:
  """(cross-entropy, correct top-1 guess in {0, 1}) per row of logits, in float32.

  One max and one exp-sum over the classes serve both loss and accuracy: an argmax
  would be a third pass over [B, L, V] (4% of a full-vocabulary BERT-small step on CPU).
  """
  logits = logits.astype(jnp.float32)
  max_logit = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
  log_z = jnp.log(jnp.sum(jnp.exp(logits - max_logit), -1)) + max_logit[..., 0]
  label_logit = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
  return log_z - label_logit, (label_logit >= max_logit[..., 0]).astype(jnp.float32)


def weighted_sums(ce, correct, weights) -> Sums:
  """weighted_ce's sums of per-row cross-entropy and correct guesses."""
  weights = weights.astype(jnp.float32)
  return {"loss_sum": jnp.sum(ce * weights), "loss_weight": jnp.sum(weights),
          "correct": jnp.sum(correct * weights)}


def chunked_weighted_ce(logits_of: Callable[[jax.Array], jax.Array], h_BxMxE, labels_BxM,
                        weights_BxM, chunk: int) -> Sums:
  """weighted_ce(logits_of(h_BxMxE), ...) without the whole logits: a scan projects
  `chunk` positions of every row at a time ([B, chunk, V] logits) and keeps only their
  cross-entropy and hits; the backward pass recomputes each chunk's logits (remat)
  instead of storing them. M is padded to a multiple of `chunk` with positions that
  count nowhere. The batch axis stays whole, so a batch sharded over devices stays so.
  """
  batch, length = labels_BxM.shape
  pad = -length % chunk
  h_BxPxE = jnp.pad(h_BxMxE, ((0, 0), (0, pad), (0, 0)))
  labels_BxP = jnp.pad(labels_BxM, ((0, 0), (0, pad)))
  chunks = lambda x: jnp.swapaxes(x.reshape(batch, -1, chunk, *x.shape[2:]), 0, 1)

  @functools.partial(jax.checkpoint, prevent_cse=False)  # in a scan: nothing to CSE
  def one_chunk(xs):
    h_BxCxE, labels_BxC = xs
    return token_ce(logits_of(h_BxCxE), labels_BxC)

  ce_NxBxC, correct_NxBxC = jax.lax.map(one_chunk, (chunks(h_BxPxE), chunks(labels_BxP)))
  rows = lambda x_NxBxC: jnp.swapaxes(x_NxBxC, 0, 1).reshape(batch, -1)[:, :length]
  return weighted_sums(rows(ce_NxBxC), rows(correct_NxBxC), weights_BxM)


def masked_cross_entropy(logits_BxN, labels_B, mask_BxN) -> jax.Array:
  """Softmax cross-entropy [B] over the allowed (mask > 0) entries only."""
  logits_BxN = jnp.where(mask_BxN > 0, logits_BxN.astype(jnp.float32), MASKED)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxN, labels_B)


def f1_scores(tp, fp, fn) -> tuple[float, float]:
  """(micro, macro) F1 from per-class counts; macro averages the classes in the gold
  labels or the predictions."""
  tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
  micro = 2 * tp.sum() / max(2 * tp.sum() + fp.sum() + fn.sum(), 1e-9)
  f1 = 2 * tp / np.maximum(2 * tp + fp + fn, 1e-9)
  present = (tp + fn + fp) > 0
  return float(micro), float(f1[present].mean()) if present.any() else 0.0


def loss_summary(sums: dict[str, Any]) -> dict[str, float]:
  """loss and accuracy (and `dropped_predictions` when counted) from the shared sums."""
  weight = max(float(sums["loss_weight"]), 1e-9)
  out = {"loss": float(sums["loss_sum"]) / weight, "accuracy": float(sums["correct"]) / weight}
  if "dropped" in sums:
    out["dropped_predictions"] = float(sums["dropped"])
  return out


def pooled_vectors(predictor, args: tuple) -> np.ndarray:
  """The pooled encoder vectors [N, D] of a run's model (its encoder params alone)."""
  params = predictor.params
  out = Encoder(predictor.cfg).apply({"params": params.get(ENCODER, params)}, *args)
  return np.asarray(out.pooled, np.float32)


def record_shapes(arrays: Shapes, batch: int, *, train: bool) -> Shapes:
  """A text_records task's arrays with the weights every row has (and, in eval, its
  `example_index`: data/pipeline.records_pipeline)."""
  extra = {} if train else per_example(batch, example_index=np.int32)
  return {**arrays, **per_example(batch, example_weights=np.float32), **extra}
