"""Scored sentence pairs for STS evaluation: a CSV (or .tsv: tab-separated) file with a
header row naming the columns `text`, `text_b` and `score` (any order; other columns
ignored), one pair a row; score a finite number (STS-B's 0-5, or any scale: only its
ranks count). Errors are one line naming file:line. Local or gs://.
"""

from __future__ import annotations

import dataclasses
import math

from jaxencoder.data.readers import DataError, read_records

COLUMNS = ("text", "text_b", "score")


@dataclasses.dataclass
class ScoredPairs:
  texts: list[str]
  texts_b: list[str]
  scores: list[float]


def read(path) -> ScoredPairs:
  pairs = ScoredPairs([], [], [])
  for row in read_records(path):
    missing = [c for c in COLUMNS if c not in row]
    if missing:
      raise DataError(f"{path}: no column {', '.join(missing)}; scored pairs need a header "
                      f"naming {', '.join(COLUMNS)}")
    try:
      score = float(row["score"])
    except ValueError:
      score = math.nan
    if not math.isfinite(score):
      raise DataError(f"{row['origin']}: score {row['score']!r} is not a finite number")
    pairs.texts.append(row["text"])
    pairs.texts_b.append(row["text_b"])
    pairs.scores.append(score)
  if len(pairs.scores) < 2:
    raise DataError(f"{path}: {len(pairs.scores)} pair; a rank correlation needs two or more")
  return pairs
