"""Minimum description length probing with the online code (Voita & Titov 2020).

The labels y_1..y_N of a layer's representations are sent block by block: the first
block (t_1 items) with the uniform code, log2(K) bits each; block k (items t_{k-1} ..
t_k - 1) with a probe trained on the items before it, -log2 p(y | x) bits each. The
online code length is their sum; the uniform code length N log2(K); compression =
uniform / online (1: the representation tells nothing about the labels; higher: more,
and more simply, since a probe fit on few items already codes the rest well). Unlike
accuracy it accounts for how much data the probe needed.

Blocks are cut at FRACTIONS of the items (0.1%, 0.2%, ... 50%, 100%, as in the paper),
items in a fixed seeded order of whole sentences. Each block's probe early-stops on a
fixed dev set, the same for every block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jaxencoder.probing import probes

MIN_EPOCHS = 200  # a probe fit on the first blocks' few items needs many epochs of one step
FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)

# fit(x_train [T, D], y_train [T]) -> log_probs(x [M, D]) -> natural-log probabilities [M, K]
Fit = Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]


def block_ends(n: int, fractions: Sequence[float] = FRACTIONS) -> list[int]:
  """The items t_1 < t_2 < ... = n at which blocks end (each block holds >= 1 item)."""
  ends = sorted({min(n, max(1, int(round(f * n)))) for f in fractions} | {n})
  return [t for t in ends if t > 0]


def online_code(x_NxD: np.ndarray, y_N: np.ndarray, num_classes: int, fit: Fit,
                fractions: Sequence[float] = FRACTIONS) -> dict:
  """{"online_bits", "uniform_bits", "compression", "blocks": [{"end", "bits"}]} of the
  labels `y_N` given `x_NxD`, in the order given."""
  y_N = np.asarray(y_N)
  n = len(y_N)
  if n < 2:
    raise ValueError(f"the online code needs at least 2 items, got {n}")
  ends = block_ends(n, fractions)
  uniform_bit = float(np.log2(num_classes))
  blocks = [{"end": ends[0], "bits": ends[0] * uniform_bit}]
  for start, end in zip(ends[:-1], ends[1:]):
    log_probs = fit(x_NxD[:start], y_N[:start])
    logp_BxK = np.asarray(log_probs(x_NxD[start:end]), np.float64)
    nats = -logp_BxK[np.arange(end - start), y_N[start:end]]
    blocks.append({"end": end, "bits": float(nats.sum() / np.log(2))})
  online = float(sum(b["bits"] for b in blocks))
  uniform = n * uniform_bit
  return {"online_bits": online, "uniform_bits": uniform,
          "compression": uniform / online if online > 0 else float("inf"), "blocks": blocks}


def probe_fit(num_classes: int, x_dev: np.ndarray, y_dev: np.ndarray, cfg) -> Fit:
  """A Fit training `probes.train_probe` (cfg: a ProbeConfig) to the epoch of least dev
  loss (a code needs calibrated probabilities, not just the right argmax), for at least
  MIN_EPOCHS; log-probabilities from its logits."""
  cfg = dataclasses.replace(cfg, select="loss", max_epochs=max(cfg.max_epochs, MIN_EPOCHS),
                            patience=max(cfg.patience, 8))

  def fit(x_train, y_train):
    params, _ = probes.train_probe(x_train, y_train, x_dev, y_dev, num_classes, cfg)
    return lambda x: np.asarray(jax.nn.log_softmax(probes.logits(params, x), -1))
  return fit


def mdl_layer(x_MxD: np.ndarray, labels_M: np.ndarray, sentence_ids_M: np.ndarray,
              splits: dict[str, np.ndarray], num_classes: int, cfg,
              control_M: np.ndarray | None = None,
              fractions: Sequence[float] = FRACTIONS) -> dict:
  """The online code of one layer's train items (whole sentences in a seeded order),
  probes early-stopped on the dev split; the control task's too when given, with keys
  prefixed `control_`."""
  x_MxD = np.asarray(x_MxD, np.float32)
  train, dev = splits["train"], splits["dev"]
  if cfg.standardize:
    mean_D, std_D = x_MxD[train].mean(0), np.maximum(x_MxD[train].std(0), 1e-6)
    x_MxD = (x_MxD - mean_D) / std_D
  order = _sentence_order(sentence_ids_M[train], cfg.seed)
  items = train[order]
  out = _summary(online_code(x_MxD[items], labels_M[items], num_classes,
                             probe_fit(num_classes, x_MxD[dev], labels_M[dev], cfg), fractions))
  if control_M is not None:
    control = online_code(x_MxD[items], control_M[items], num_classes,
                          probe_fit(num_classes, x_MxD[dev], control_M[dev], cfg), fractions)
    out.update({f"control_{k}": v for k, v in _summary(control).items()})
  return out


def _summary(code: dict) -> dict:
  return {k: code[k] for k in ("online_bits", "uniform_bits", "compression")}


def _sentence_order(sentence_ids_T: np.ndarray, seed: int) -> np.ndarray:
  """Indices of the items, whole sentences in a seeded random order (within a sentence,
  its order)."""
  sentences = np.random.default_rng(seed).permutation(np.unique(sentence_ids_T))
  rank = {s: r for r, s in enumerate(sentences)}
  keys = np.array([rank[s] for s in sentence_ids_T])
  return np.argsort(keys, kind="stable")
