"""Training-health report from a train.py workdir's metrics.jsonl.

Flags: no learning (train loss barely fell), plateau (train loss flat at the end),
overfitting (eval loss well above train loss and rising from its best). Losses are
averaged over a window (a share of the records) so a single noisy step flags nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from jaxencoder.model.config import dataclass_from_dict
from jaxencoder.io.run_dir import read_metrics


@dataclasses.dataclass(frozen=True)
class HealthThresholds:
  window: float = 0.1  # share of the train records averaged at the start / at the end
  min_improvement: float = 0.05  # train loss must fall by this share of its start value
  plateau_change: float = 0.01  # |relative change| between the last two windows
  max_gap: float = 0.1  # (eval - train) / train loss at the end
  min_rise: float = 0.02  # final eval loss above its best by this share

  @classmethod
  def from_dict(cls, fields: Mapping[str, float] | None) -> "HealthThresholds":
    return dataclass_from_dict(cls, fields, noun="key")


def series(records: Sequence[Mapping], split: str, key: str = "loss") -> np.ndarray:
  """[T] finite values of `key` for `split`, ordered by step."""
  rows = sorted((r["step"], r[key]) for r in records
                if r.get("split") == split and key in r and math.isfinite(r[key]))
  return np.array([v for _, v in rows], np.float64)


def _windows(values: np.ndarray, share: float) -> tuple[float, float, float]:
  """(mean of first window, mean of the window before the last, mean of last window)."""
  k = max(1, int(round(share * len(values))))
  before = values[-2 * k:-k] if len(values) >= 2 * k else values[:k]
  return float(values[:k].mean()), float(before.mean()), float(values[-k:].mean())


def train_trend(train: np.ndarray, t: HealthThresholds) -> dict:
  start, before, end = _windows(train, t.window)
  improvement = 1.0 - end / start if start else 0.0
  change = abs(end - before) / max(abs(before), 1e-12)
  return {"start_loss": start, "end_loss": end, "improvement": improvement,
          "end_change": change, "no_learning": improvement < t.min_improvement,
          "plateau": len(train) >= 4 and change < t.plateau_change}


def eval_gap(train_end: float, evals: np.ndarray, t: HealthThresholds) -> dict:
  best, last = float(evals.min()), float(evals[-1])
  gap = (last - train_end) / max(abs(train_end), 1e-12)
  rise = last / best - 1.0 if best > 0 else 0.0
  return {"eval_best_loss": best, "eval_last_loss": last, "gap": gap, "eval_rise": rise,
          "overfitting": gap > t.max_gap and rise > t.min_rise}


def training_health(records: Sequence[Mapping], t: HealthThresholds = HealthThresholds()
                    ) -> dict:
  """Numbers and flags for one run's metric records (see module docstring)."""
  train = series(records, "train")
  if not len(train):
    return {"error": "no train loss records", "flags": []}
  out = {"train_records": int(len(train)), **train_trend(train, t)}
  evals = series(records, "eval")
  if len(evals):
    out.update(eval_gap(out["end_loss"], evals, t))
  for key in ("accuracy",):
    tr, ev = series(records, "train", key), series(records, "eval", key)
    if len(tr) and len(ev):
      out["accuracy_gap"] = _windows(tr, t.window)[2] - float(ev[-1])
  flags = [name for name in ("no_learning", "plateau", "overfitting") if out.get(name)]
  out["flags"] = flags
  out["verdict"] = ("underfitting: loss did not fall" if "no_learning" in flags else
                    "overfitting" if "overfitting" in flags else
                    "plateau" if "plateau" in flags else "healthy")
  return out


def workdir_health(workdir, t: HealthThresholds = HealthThresholds()) -> dict:
  return training_health(read_metrics(workdir), t)


def verdict_line(report: Mapping) -> str:
  """One line for the CLI summary: the verdict and the losses behind it."""
  if "verdict" not in report:
    return f"training health: unknown ({report.get('error', 'no verdict')})"
  line = (f"training health: {report['verdict']} (train loss {report['start_loss']:.3f} -> "
          f"{report['end_loss']:.3f}")
  if "eval_last_loss" in report:
    line += f", eval loss {report['eval_last_loss']:.3f}, gap {report['gap']:+.1%}"
  return line + ")"
