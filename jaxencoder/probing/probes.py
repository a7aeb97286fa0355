"""Probes on frozen features: softmax regression (L2) or a one-hidden-layer MLP, per layer.

Training is mini-batch Adam (optax) with early stopping on a dev split; splits are by
sentence, never by token. Control tasks (Hewitt & Liang 2019) give each word type a
random label drawn from the task's label distribution; selectivity = task accuracy -
control accuracy. Everything is deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder import progress as progress_lib

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  kind: str = "linear"  # linear | mlp
  hidden: int = 256  # mlp width
  l2: float = 1e-4  # on weight matrices
  learning_rate: float = 3e-3
  batch_size: int = 256
  max_epochs: int = 40
  patience: int = 4  # epochs without a better dev accuracy before stopping
  standardize: bool = True  # z-score features with train statistics
  seed: int = 0
  select: str = "accuracy"  # accuracy | loss: the dev measure that picks the epoch

  def __post_init__(self):
    if self.kind not in ("linear", "mlp"):
      raise ValueError(f"ProbeConfig.kind must be 'linear' or 'mlp', got {self.kind!r}")
    if self.select not in ("accuracy", "loss"):
      raise ValueError(f"ProbeConfig.select must be 'accuracy' or 'loss', got {self.select!r}")


# --- splits and labels -------------------------------------------------------------------
MIN_SENTENCES = 10  # with the default 0.8 / 0.1 / 0.1 split, one sentence each for dev, test
def split_items(sentence_ids_M: np.ndarray, fractions: Sequence[float] = (0.8, 0.1, 0.1),
                seed: int = 0) -> dict[str, np.ndarray]:
  """{"train"|"dev"|"test": item indices}: whole sentences shuffled into the splits."""
  sentences = np.unique(sentence_ids_M)
  order = np.random.default_rng(seed).permutation(sentences)
  cuts = np.round(np.cumsum(fractions)[:-1] / np.sum(fractions) * len(order)).astype(int)
  chosen = np.split(order, cuts)
  empty = [name for name, ids in zip(SPLITS, chosen) if not len(ids)]
  if empty:
    raise ValueError(f"{len(sentences)} sentences are too few to split {tuple(fractions)} into "
                     f"train/dev/test: {', '.join(empty)} would be empty; use more data "
                     f"(at least {MIN_SENTENCES} sentences)")
  return {name: np.flatnonzero(np.isin(sentence_ids_M, ids)) for name, ids in zip(SPLITS, chosen)}


def control_labels(types: Sequence[str], labels_M: np.ndarray, num_classes: int, *,
                   seed: int = 0, lowercase: bool = True) -> np.ndarray:
  """[M] control task: one random label per word type, drawn from the label distribution."""
  keys = [t.lower() for t in types] if lowercase else list(types)
  vocab = sorted(set(keys))
  dist_C = np.bincount(labels_M, minlength=num_classes) / len(labels_M)
  drawn = np.random.default_rng(seed).choice(num_classes, size=len(vocab), p=dist_C)
  label_of = dict(zip(vocab, drawn))
  return np.array([label_of[k] for k in keys], np.int32)


def majority_accuracy(y_train: np.ndarray, y_test: np.ndarray) -> float:
  """Accuracy of always predicting the most frequent training label."""
  return float(np.mean(y_test == np.bincount(y_train).argmax()))


# --- the probe ---------------------------------------------------------------------------
def init_probe(cfg: ProbeConfig, dim: int, num_classes: int, key: jax.Array) -> dict:
  if cfg.kind == "linear":
    return {"w_DxC": jnp.zeros((dim, num_classes)), "b_C": jnp.zeros(num_classes)}
  k1, k2 = jax.random.split(key)
  return {"w1_DxF": jax.random.normal(k1, (dim, cfg.hidden)) / np.sqrt(dim),
          "b1_F": jnp.zeros(cfg.hidden),
          "w2_FxC": jax.random.normal(k2, (cfg.hidden, num_classes)) / np.sqrt(cfg.hidden),
          "b2_C": jnp.zeros(num_classes)}


def logits(params: dict, x_BxD: jax.Array) -> jax.Array:
  if "w_DxC" in params:
    return x_BxD @ params["w_DxC"] + params["b_C"][None]
  h_BxF = jax.nn.relu(x_BxD @ params["w1_DxF"] + params["b1_F"][None])
  return h_BxF @ params["w2_FxC"] + params["b2_C"][None]


def _loss(params, x_BxD, y_B, w_B, l2: float):
  ce_B = optax.softmax_cross_entropy_with_integer_labels(logits(params, x_BxD), y_B)
  decay = sum(jnp.sum(v * v) for k, v in params.items() if k.startswith("w"))
  return jnp.sum(ce_B * w_B) / jnp.maximum(jnp.sum(w_B), 1.0) + l2 * decay


@functools.partial(jax.jit, static_argnames="cfg")
def _epoch(params, opt_state, x_KxBxD, y_KxB, w_KxB, cfg: ProbeConfig):
  """One pass over K mini-batches (a scan: one compile per shape)."""
  tx = optax.adam(cfg.learning_rate)

  def step(carry, batch):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(_loss)(params, *batch, cfg.l2)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  (params, opt_state), losses_K = jax.lax.scan(step, (params, opt_state),
                                               (x_KxBxD, y_KxB, w_KxB))
  return params, opt_state, losses_K.mean()


@jax.jit
def _predict(params, x_MxD):
  return jnp.argmax(logits(params, x_MxD), -1)


@jax.jit
def _mean_nll(params, x_MxD, y_M):
  return optax.softmax_cross_entropy_with_integer_labels(logits(params, x_MxD), y_M).mean()


def accuracy(params: dict, x_MxD: np.ndarray, y_M: np.ndarray) -> float:
  return float(np.mean(np.asarray(_predict(params, x_MxD)) == y_M)) if len(y_M) else float("nan")


def _batches(x_MxD, y_M, batch_size: int, rng: np.random.Generator):
  """Shuffled [K, B, D] / [K, B] / weights [K, B] (padding rows weigh 0)."""
  k = -(-len(y_M) // batch_size)
  order = np.resize(rng.permutation(len(y_M)), k * batch_size)
  w = (np.arange(k * batch_size) < len(y_M)).astype(np.float32)
  return (x_MxD[order].reshape(k, batch_size, -1), y_M[order].reshape(k, batch_size),
          w.reshape(k, batch_size))


def train_probe(x_train, y_train, x_dev, y_dev, num_classes: int, cfg: ProbeConfig
                ) -> tuple[dict, dict]:
  """(best params by dev accuracy, or by dev loss with cfg.select="loss", {"epochs",
  "dev_accuracy"}); stops after `patience` epochs without a better one."""
  rng = np.random.default_rng(cfg.seed)
  params = init_probe(cfg, x_train.shape[1], num_classes, jax.random.key(cfg.seed))
  opt_state = optax.adam(cfg.learning_rate).init(params)
  best, best_score, since, epoch = params, -np.inf, 0, 0
  for epoch in range(1, cfg.max_epochs + 1):
    batches = _batches(x_train, y_train, min(cfg.batch_size, len(y_train)), rng)
    params, opt_state, _ = _epoch(params, opt_state, *batches, cfg=cfg)
    score = (accuracy(params, x_dev, y_dev) if cfg.select == "accuracy"
             else -float(_mean_nll(params, x_dev, y_dev)))
    if score > best_score:
      best, best_score, since = params, score, 0
    else:
      since += 1
      if since >= cfg.patience:
        break
  return best, {"epochs": epoch, "dev_accuracy": accuracy(best, x_dev, y_dev)}


def _standardized(x_MxD: np.ndarray, train_idx: np.ndarray) -> np.ndarray:
  mean_D = x_MxD[train_idx].mean(0)
  std_D = x_MxD[train_idx].std(0)
  return ((x_MxD - mean_D[None]) / np.maximum(std_D, 1e-6)[None]).astype(np.float32)


def fit_and_score(x_MxD: np.ndarray, y_M: np.ndarray, splits: dict[str, np.ndarray],
                  num_classes: int, cfg: ProbeConfig) -> dict:
  """Trains on splits["train"], early-stops on "dev", reports test accuracy."""
  tr, dev, test = (splits[s] for s in SPLITS)
  params, info = train_probe(x_MxD[tr], y_M[tr], x_MxD[dev], y_M[dev], num_classes, cfg)
  return {"accuracy": accuracy(params, x_MxD[test], y_M[test]), **info}


def probe_layer(x_MxD: np.ndarray, labels_M: np.ndarray, splits: dict[str, np.ndarray],
                num_classes: int, cfg: ProbeConfig, control_M: np.ndarray | None = None
                ) -> dict:
  """Task accuracy, and control accuracy + selectivity when a control task is given."""
  x_MxD = np.asarray(x_MxD, np.float32)
  if cfg.standardize:
    x_MxD = _standardized(x_MxD, splits["train"])
  task = fit_and_score(x_MxD, labels_M, splits, num_classes, cfg)
  out = {"accuracy": task["accuracy"], "dev_accuracy": task["dev_accuracy"],
         "epochs": task["epochs"]}
  if control_M is not None:
    control = fit_and_score(x_MxD, control_M, splits, num_classes, cfg)
    out.update(control_accuracy=control["accuracy"], control_epochs=control["epochs"],
               selectivity=task["accuracy"] - control["accuracy"])
  return out


def probe_all_layers(layers: Sequence[np.ndarray], labels_M: np.ndarray,
                     sentence_ids_M: np.ndarray, num_classes: int, cfg: ProbeConfig, *,
                     types: Sequence[str] | None = None,
                     fractions: Sequence[float] = (0.8, 0.1, 0.1), progress: bool = True
                     ) -> dict:
  """One probe per layer (+ control probes when word `types` are given), same splits.
  `progress`: a line (or bar) per layer fitted, on stderr."""
  splits = split_items(sentence_ids_M, fractions, cfg.seed)
  control_M = None if types is None else control_labels(types, labels_M, num_classes,
                                                         seed=cfg.seed)
  out = {"config": dataclasses.asdict(cfg),
         "split_sizes": {k: int(len(v)) for k, v in splits.items()},
         "majority_baseline": majority_accuracy(labels_M[splits["train"]],
                                                labels_M[splits["test"]]),
         "majority_label": int(np.bincount(labels_M[splits["train"]]).argmax()),
         "control_task": control_M is not None}
  if control_M is not None:
    out["control_majority_baseline"] = majority_accuracy(control_M[splits["train"]],
                                                         control_M[splits["test"]])
  desc = f"fitting {cfg.kind} probes" + (" (+ control)" if control_M is not None else "")
  fitting = progress_lib.track(enumerate(layers), desc, total=len(layers), unit="layer",
                               every=1, enabled=progress)
  out["layers"] = [{"layer": n, **probe_layer(x, labels_M, splits, num_classes, cfg, control_M)}
                   for n, x in fitting]
  return out
