"""Hard negatives mined with a model: `jaxencoder-data mine`.

For each (text, text_b) row of a pairs dataset's train split, the `k` candidates that
`embed` ranks nearest the text, among every text_b and negative text of that split, are
its hard negatives, leaving out the row's own positive and text, and every candidate
scoring above the positive's score minus `margin` (likely a false negative: as close as
the answer). The search is exact and in blocks (search.top_k). A row with fewer than k
such candidates is dropped (counted).

The result is a new text_records dataset DATA_DIR/tfds/text_records/NAME (train split only;
its CSV and mined.json, what it was mined from, in DATA_DIR/mined/NAME) with the columns
text, text_b, negative_1 .. negative_k, which `contrastive` reads as [2 + k, L] groups:
train with data.source=text_records/NAME. An existing NAME is refused: nothing is overwritten.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Sequence

import numpy as np
from etils import epath

from jaxencoder.data import builders, fetch, readers, records, sources
from jaxencoder.io import paths
from jaxencoder.retrieval import search
from jaxencoder.retrieval.evaluate import Embed

MINED = "mined"  # DATA_DIR/mined/NAME: the mined CSV and mined.json


@dataclasses.dataclass
class Mined:
  dataset: epath.Path  # the prepared dataset
  rows: int  # rows written
  dropped: int  # rows with fewer than k candidates below the margin


def hard_negatives(embed: Embed, texts: Sequence[str], positives: Sequence[str],
                   candidates: Sequence[str], *, k: int, margin: float,
                   block: int = search.BLOCK) -> np.ndarray:
  """Candidate indices [Q, k] of each text's hard negatives, nearest first (-1: fewer than
  k candidates left); `candidates` distinct, holding every positive."""
  index = {c: i for i, c in enumerate(candidates)}
  positive_Q = np.array([index[p] for p in positives])
  exclude_Qx2 = np.stack([positive_Q, [index.get(t, -1) for t in texts]], 1)
  texts_QxD, candidates_NxD = embed(list(texts)), embed(list(candidates))
  positive_scores_Q = np.sum(texts_QxD * candidates_NxD[positive_Q], -1)
  _, ids_QxK = search.top_k(texts_QxD, candidates_NxD, k, exclude_QxE=exclude_Qx2,
                            max_score_Q=positive_scores_Q - margin, block=block)
  return ids_QxK


def mine(embed: Embed, source: str, data_dir, name: str, *, k: int, margin: float,
         block: int = search.BLOCK, about: dict | None = None) -> Mined:
  """Mines `source`'s train split (a fetchable pairs source, a prepared dataset KIND/NAME
  under DATA_DIR/tfds or its directory) into the new dataset `name`; `about` (e.g. the
  model's name) is kept in mined.json."""
  if k < 1:
    raise ValueError(f"--k {k}: mine at least one negative per row")
  folder = _new_output(data_dir, name)
  rows = train_rows(source, data_dir)
  candidates = list(dict.fromkeys(t for r in rows for c, t in r.items() if c != "text"))
  ids_QxK = hard_negatives(embed, [r["text"] for r in rows], [r["text_b"] for r in rows],
                           candidates, k=k, margin=margin, block=block)
  kept = [{"text": r["text"], "text_b": r["text_b"],
           **{f"negative_{j + 1}": candidates[i] for j, i in enumerate(ids)}}
          for r, ids in zip(rows, ids_QxK) if ids.min() >= 0]
  if not kept:
    raise ValueError(f"{source}: no row has {k} candidates scoring below its positive's "
                     f"score minus --margin {margin}; lower --k or --margin")
  folder.mkdir(parents=True)
  try:
    _write_csv(folder / "train.csv", kept)
    (folder / "mined.json").write_text(json.dumps(
        {"source": source, "k": k, "margin": margin, "rows": len(kept),
         "dropped": len(rows) - len(kept), **(about or {})}, indent=1) + "\n")
    dataset = builders.prepare("text_records", folder, paths.as_path(data_dir) / "tfds",
                               name=name)
  except BaseException:
    folder.rmtree()  # what this call wrote: a rerun under the same name may start over
    raise
  return Mined(dataset, len(kept), len(rows) - len(kept))


def _new_output(data_dir, name: str) -> epath.Path:
  """DATA_DIR/mined/NAME, for a NAME neither there nor prepared under DATA_DIR/tfds."""
  builders.check_name(name)
  folder = paths.as_path(data_dir) / MINED / name
  for path in (paths.as_path(data_dir) / "tfds" / "text_records" / name, folder):
    if path.exists():
      raise FileExistsError(f"{path} exists: mining writes a new dataset and never "
                            "overwrites one; pick another --name")
  return folder


def train_rows(source: str, data_dir) -> list[dict[str, str]]:
  """The train split's text columns (text, text_b, any negative*) as strings."""
  if builders.fetched(source) is not None:
    fetch.fetch(source, data_dir)
    source = str(builders.prepare_fetched(source, data_dir))
  split = sources.open_source(source, "train", paths.as_path(data_dir) / "tfds")
  rows = [split[i] for i in range(len(split))]
  columns = ["text", "text_b"] + records.negative_columns(rows[0] if rows else {})
  missing = [c for c in columns[:2] if not rows or c not in rows[0]]
  if missing:
    raise readers.DataError(f"{source}: mining reads pairs (columns text, text_b); the "
                            f"train split has no {', '.join(missing)}")
  return [{c: readers.as_text(r[c]) for c in columns} for r in rows]


def _write_csv(path: epath.Path, rows: list[dict[str, str]]) -> None:
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, list(rows[0]))
  writer.writeheader()
  writer.writerows(rows)
  path.write_text(text.getvalue())
