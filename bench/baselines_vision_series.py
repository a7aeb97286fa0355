"""Baselines beside configs/vit_fashion_mnist.py and configs/time_series.py.

  python bench/baselines_vision_series.py [--data-dir data] [--ucr GunPoint BasicMotions]

Fashion-MNIST: multinomial logistic regression on raw pixels (x/255), full-batch Adam
with a small L2, on the standard 60k train / 10k test split. UCR/UEA: one-nearest-
neighbour with DTW (full window, squared-difference cost summed over channels) and with
Euclidean distance, on each set's standard TRAIN / TEST split. Sources are fetched on
first use (jaxencoder.data.fetch). Prints one JSON line per baseline.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder.data import fetch, readers


def logistic_regression(x_NxD, y_N, num_classes: int, *, steps: int = 500, lr: float = 0.05,
                        l2: float = 1e-4):
  """Softmax regression fitted with full-batch Adam; returns (W [D, C], b [C])."""
  params = (jnp.zeros((x_NxD.shape[1], num_classes)), jnp.zeros(num_classes))
  opt = optax.adam(lr)

  def loss_fn(p):
    w_DxC, b_C = p
    logits_NxC = x_NxD @ w_DxC + b_C
    nll = optax.softmax_cross_entropy_with_integer_labels(logits_NxC, y_N).mean()
    return nll + l2 * jnp.sum(w_DxC ** 2)

  @jax.jit
  def step(p, state):
    grads = jax.grad(loss_fn)(p)
    updates, state = opt.update(grads, state)
    return optax.apply_updates(p, updates), state

  state = opt.init(params)
  for _ in range(steps):
    params, state = step(params, state)
  return params


def fashion_mnist(data_dir) -> dict:
  pairs = readers.read_image_pairs(fetch.fetch("fashion_mnist", data_dir))
  flat = lambda x: jnp.asarray(x.reshape(len(x), -1), jnp.float32) / 255.0
  (x_tr, y_tr), (x_te, y_te) = pairs["train"], pairs["test"]
  start = time.perf_counter()
  w_DxC, b_C = logistic_regression(flat(x_tr), jnp.asarray(y_tr), 10)
  pred_N = np.asarray(jnp.argmax(flat(x_te) @ w_DxC + b_C, -1))
  return {"data": "fashion_mnist", "baseline": "logistic regression (raw pixels)",
          "test_accuracy": round(float((pred_N == y_te).mean()), 4),
          "train": len(y_tr), "test": len(y_te),
          "seconds": round(time.perf_counter() - start, 1)}


def dtw_distances(a_AxLxF: np.ndarray, b_BxMxF: np.ndarray) -> np.ndarray:
  """Full-window DTW between every pair, [A, B]: the DP runs over (i, j), vectorised over
  the A*B pairs; cost = squared difference summed over channels."""
  num_a, num_b, m = len(a_AxLxF), len(b_BxMxF), b_BxMxF.shape[1]
  prev_PxM = np.full((num_a * num_b, m + 1), np.inf)  # column 0: before the first step
  prev_PxM[:, 0] = 0.0
  for i in range(a_AxLxF.shape[1]):
    cost_PxM = ((a_AxLxF[:, None, None, i] - b_BxMxF[None]) ** 2).sum(-1).reshape(-1, m)
    row_PxM = np.full_like(prev_PxM, np.inf)
    for j in range(1, m + 1):
      best_P = np.minimum(np.minimum(prev_PxM[:, j], row_PxM[:, j - 1]), prev_PxM[:, j - 1])
      row_PxM[:, j] = cost_PxM[:, j - 1] + best_P
    prev_PxM = row_PxM
  return prev_PxM[:, m].reshape(num_a, num_b)


def _series(path) -> tuple[np.ndarray, list[str]]:
  _, exs = readers.read_ts(path)
  return np.stack([e["series"] for e in exs]).astype(np.float64), [e["label"] for e in exs]


def ucr(name: str, data_dir) -> list[dict]:
  root = fetch.fetch(f"ucr/{name}", data_dir)
  x_tr, y_tr = _series(next(root.glob("*_TRAIN.ts")))
  x_te, y_te = _series(next(root.glob("*_TEST.ts")))
  y_tr, y_te = np.asarray(y_tr), np.asarray(y_te)
  out = []
  for label, distances in (("1-NN DTW (full window)", dtw_distances),
                           ("1-NN Euclidean", _euclidean)):
    start = time.perf_counter()
    pred = y_tr[np.argmin(distances(x_te, x_tr), axis=1)]
    out.append({"data": f"ucr/{root.name}", "baseline": label,
                "test_accuracy": round(float((pred == y_te).mean()), 4),
                "train": len(y_tr), "test": len(y_te), "channels": x_tr.shape[2],
                "seconds": round(time.perf_counter() - start, 1)})
  return out


def _euclidean(a_AxLxF, b_BxLxF):
  return ((a_AxLxF[:, None] - b_BxLxF[None]) ** 2).sum((2, 3))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--data-dir", default="data")
  p.add_argument("--ucr", nargs="*", default=["GunPoint", "BasicMotions"])
  p.add_argument("--skip-images", action="store_true")
  args = p.parse_args(argv)
  if not args.skip_images:
    print(json.dumps(fashion_mnist(args.data_dir)), flush=True)
  for name in args.ucr:
    for row in ucr(name, args.data_dir):
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
