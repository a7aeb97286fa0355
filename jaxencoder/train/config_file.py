"""A config file: `get_config()` of configs/*.py (or `get_config(ARG)` of `FILE.py:ARG`),
run with every mistake in it named in one line (file:line and the error), never a
traceback (JAXENCODER_TRACEBACK=1 shows it).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import traceback

import ml_collections

from jaxencoder import cli


def load_config(path: str):
  """Runs `get_config()` of a config file; `FILE.py:ARG` runs `get_config(ARG)` (a variant
  the file defines, e.g. `configs/modernbert_base.py:cpu`)."""
  text, arg = str(path), ""
  if ".py:" in text:
    text, arg = text.rsplit(".py:", 1)
    text += ".py"
  path = pathlib.Path(text)
  if not path.is_file():
    raise cli.UserError(f"--config {path}: no such file")
  if path.suffix != ".py":
    raise cli.UserError(f"--config {path}: expected a Python config file (configs/*.py) with "
                    "get_config()")
  spec = importlib.util.spec_from_file_location(f"config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  call = f"get_config({arg!r})" if arg else "get_config()"
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      raise cli.UserError(f"--config {path}: defines no get_config()")
    config = module.get_config(arg) if arg else module.get_config()
  except cli.UserError:
    raise
  except SyntaxError as e:  # also IndentationError
    raise cli.UserError(f"--config {e.filename}:{e.lineno}: {e.msg}") from _cause(e)
  except Exception as e:  # whatever the file runs into: one line naming it, never a traceback
    raise cli.UserError(f"--config {_failing_line(path, e)}: {_one_line(e)}") from _cause(e)
  if not isinstance(config, ml_collections.ConfigDict):
    returned = "None (no return?)" if config is None else f"a {type(config).__name__}"
    raise cli.UserError(f"--config {path}: {call} returned {returned}, not an "
                        "ml_collections.ConfigDict; return one, e.g. base_config() from "
                        "jaxencoder.train.config with the keys it changes")
  return config


def _one_line(error: Exception) -> str:
  """`Type: message`, the message's first line (`Type` alone without one)."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _cause(error: Exception) -> Exception | None:
  """The error behind a config file's one line: shown with JAXENCODER_TRACEBACK=1."""
  return error if os.environ.get("JAXENCODER_TRACEBACK") else None


def _failing_line(path: pathlib.Path, error: Exception) -> str:
  """file:line of the config file's deepest line in `error`'s traceback."""
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if pathlib.Path(frame.filename) == path]
  return f"{path}:{lines[-1]}" if lines else str(path)
