"""Early stopping on best_metric: `Patience` counts the evals in a row without a better
value (strictly better: a tie does not improve). Its count is replayed from the run's own
eval rows in metrics.jsonl (`replayed`): a resume drops the rows past the step it restores
(RunDir.drop_metrics_after), so a killed and resumed run stops at the step an uninterrupted
one stops at."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping


@dataclasses.dataclass
class Patience:
  """`metric` (an eval metric, e.g. "accuracy") in `mode` ("min" | "max"); `patience`
  evals without a better one stop the run (0: never)."""
  metric: str
  mode: str
  patience: int = 0
  best: float | None = None
  best_step: int | None = None
  waited: int = 0  # evals since the best one

  def update(self, step: int, metrics: Mapping[str, float]) -> bool:
    """Counts the eval at `step`; True when it is a new best."""
    if self.metric not in metrics:
      raise ValueError(f"best_metric={self.metric!r} is not an eval metric of this task: "
                       f"{', '.join(sorted(metrics))}")
    value = float(metrics[self.metric])
    better = self.best is None or (value < self.best if self.mode == "min" else value > self.best)
    if better:
      self.best, self.best_step, self.waited = value, step, 0
    else:
      self.waited += 1
    return better

  @property
  def exhausted(self) -> bool:
    return self.patience > 0 and self.waited >= self.patience

  def reason(self) -> str:
    return (f"eval {self.metric} has not improved on {self.best:.4g} (step {self.best_step}) "
            f"for {self.waited} evals (early_stopping_patience={self.patience})")


def replayed(rows: Iterable[Mapping], patience: Patience, upto: int) -> Patience:
  """`patience` after the eval rows of metrics.jsonl up to step `upto`, in step order."""
  evals = sorted((r for r in rows if r.get("split") == "eval" and r.get("step", 0) <= upto
                  and patience.metric in r), key=lambda r: r["step"])
  for row in evals:
    patience.update(row["step"], row)
  return patience
