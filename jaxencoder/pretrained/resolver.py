"""Where a name or path points: the one resolver that `jaxencoder.load`, init_from, the
probe, predict, export, convert and `pretrained.load` ask.

  minilm               a registered name (NAMED_CHECKPOINTS) -> its Hugging Face directory
  DIR with config.json a Hugging Face directory ("hf")
  RUN                  a run directory ("run"): its newest step that restores
  RUN@STEP             a run directory at STEP
Any of the paths may be a gs:// URL.
"""

from __future__ import annotations

import dataclasses
import os
import re

from jaxencoder import cli
from jaxencoder.io.paths import as_path, is_url
from jaxencoder.io.run_dir import CHECKPOINTS
from jaxencoder.pretrained.named_checkpoints import NAMED_CHECKPOINTS, named_checkpoint

HF_CONFIG = "config.json"  # what makes a directory a Hugging Face one (hf_checkpoint.CONFIG)
PATHS = "a Hugging Face directory, a run directory or RUN@STEP, local or gs://"


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A Hugging Face directory (kind "hf") or a run directory (kind "run") at `step` (None:
  its newest that restores). `path` as given, or a registered name's directory (`name`)."""
  kind: str
  path: str
  step: int | None = None
  name: str | None = None


def is_hf_dir(path) -> bool:
  return (as_path(path) / HF_CONFIG).exists()


def split_step(text: str) -> tuple[str, int | None]:
  """("RUN", STEP) of "RUN@STEP" (unless a path of that whole name exists), else (text, None)."""
  match = re.fullmatch(r"(.+)@(\d+)", text)
  if match is None or as_path(text).exists():
    return text, None
  return match[1], int(match[2])


def resolve(name_or_path, *, strict: bool = False) -> Resolved:
  """Where `name_or_path` points (see the module's table). Anything else is a run
  directory for its reader to open (and refuse in its own words); `strict` (jaxencoder.load)
  refuses it here in one line: an unknown name with the registered ones, or a path that
  is neither kind."""
  text = os.fspath(name_or_path)
  if text in NAMED_CHECKPOINTS:
    return Resolved("hf", named_checkpoint(text), name=text)
  path, step = split_step(text)
  if step is None and is_hf_dir(path):
    return Resolved("hf", path)
  if strict:
    _check_run(text, path)
  return Resolved("run", path, step)


def _check_run(text: str, path: str) -> None:
  """One line unless `path` is a run directory (or its checkpoints/ folder)."""
  if is_run_dir(path):
    return
  where = as_path(path)
  if not where.exists() and "/" not in text and not is_url(text):
    raise ValueError(cli.unknown("checkpoint name", text, NAMED_CHECKPOINTS,
                                 f"registered: {', '.join(NAMED_CHECKPOINTS)}; or a path: {PATHS}"))
  what = "no such file or directory" if not where.exists() else (
      f"neither a Hugging Face directory ({HF_CONFIG}) nor a run directory ({CHECKPOINTS}/)")
  raise FileNotFoundError(f"{text}: {what}; jaxencoder.load takes a registered name "
                          f"({', '.join(NAMED_CHECKPOINTS)}), {PATHS}")


def hf_dir(name_or_path, reader: str, run_reader: str = "") -> str:
  """The Hugging Face directory `name_or_path` names, for a `reader` of those only: a run
  directory is one ValueError naming `run_reader` (default: jaxencoder.load); anything
  else is returned as given, for the reader to refuse in its own words."""
  where, text = resolve(name_or_path), os.fspath(name_or_path)
  if where.kind == "hf":
    return where.path
  if is_run_dir(where.path):
    run_reader = run_reader or f"jaxencoder.load({text!r}) reads both"
    raise ValueError(f"{text}: a run directory; {reader} reads Hugging Face directories, "
                     f"{run_reader}")
  return text


def is_run_dir(path) -> bool:
  """Whether `path` holds checkpoints/ (or is that folder): a run directory to open."""
  where = as_path(path)
  return (where / CHECKPOINTS).exists() or (where.name == CHECKPOINTS and where.exists())
