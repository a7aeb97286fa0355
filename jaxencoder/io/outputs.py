"""Where a tool writes: never over what it reads, and `--overwrite` only over its own output.

Every tool that writes (convert, export, predict, probe) calls `check_apart` with its
output and its inputs before it reads or writes anything: an output that is, contains or
lies inside an input is refused in one line naming both. A tool that writes a directory
calls `check_replaceable` (a non-empty one is replaced only with --overwrite, and only
if it holds MARKER naming that tool and no file the tool did not write) and `mark` last,
or writes inside `replacing`, which does both ends for it.
Paths may be local or gs:// URLs; local ones are compared with symlinks resolved.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator

from jaxencoder.io import paths

MARKER = ".jaxencoder-output.json"  # {"tool": "jaxencoder-convert", "files": [...]}
Labelled = tuple[str, "os.PathLike | str | None"]  # ("--from", path); None: not given


def check_apart(output: Labelled, inputs: Iterable[Labelled]) -> None:
  """ValueError unless `output` ("--to", path) and each input are disjoint paths."""
  out_label, out = output
  for in_label, source in inputs:
    if source is None or str(source) == "":
      continue
    relation = _overlap(out, source)
    if relation:
      raise ValueError(f"{out_label} {out} {relation} {in_label} {source}, which this "
                       "command reads; choose an output path apart from it")


def run_inputs(label: str, run) -> list[Labelled]:
  """A run directory (an io.run_dir.RunDir) as inputs: the directory and its tokenizer."""
  return [(label, run.path), (f"{label}'s tokenizer", run.tokenizer_path())]


def _overlap(out, source) -> str | None:
  """"is", "contains" or "lies inside" when `out` and `source` overlap, else None."""
  a, b = _parts(out), _parts(source)
  if a is None or b is None or a[0] != b[0]:  # local vs URL, or another bucket
    return None
  if a == b:
    return "is"
  if b[:len(a)] == a:
    return "contains"
  if a[:len(b)] == b:
    return "lies inside"
  return None


def _parts(path) -> tuple[str, ...] | None:
  """Comparable parts of a path: a URL's scheme and names, or a local real path's."""
  text = os.fspath(path)
  if paths.is_url(text):
    scheme, _, rest = text.partition("://")
    return (scheme + "://", *(p for p in rest.split("/") if p))
  return pathlib.Path(os.path.realpath(os.path.expanduser(text))).parts


def check_replaceable(label: str, out, tool: str, overwrite: bool) -> None:
  """FileExistsError unless the directory `out` is missing or empty, or `overwrite` and
  `tool` wrote it (its MARKER names `tool` and lists every file there)."""
  out = paths.as_path(out)
  if not out.exists():
    return
  if not out.is_dir():
    raise FileExistsError(f"{label} {out} is a file; choose a directory path")
  if not any(out.iterdir()):
    return
  stranger = _not_written_by(out, tool)
  if stranger:
    raise FileExistsError(f"{label} {out} is not empty and {stranger}, so it is never "
                          f"replaced (not even with --overwrite); choose a new {label}")
  if not overwrite:
    raise FileExistsError(f"{out} is not empty; choose a new {label} or pass --overwrite "
                          f"(it holds an earlier {tool} output)")


def _not_written_by(out, tool: str) -> str | None:
  """Why `tool` did not write `out` (or wrote it, and something else was added); None
  when it is wholly `tool`'s output."""
  marker = out / MARKER
  try:
    record = json.loads(marker.read_text())
  except (OSError, ValueError):
    return f"was not written by {tool} (no {MARKER})"
  if record.get("tool") != tool:
    return f"was written by {record.get('tool')!r}, not {tool}"
  extra = sorted(set(paths.files_under(out)) - set(record.get("files", ())) - {MARKER})
  if extra:
    return f"holds {extra[0]}, which {tool} did not write"
  return None


def mark(out, tool: str) -> None:
  """Records in `out` that `tool` wrote it, and which files: call once it is complete."""
  out = paths.as_path(out)
  files = [name for name in paths.files_under(out) if name != MARKER]
  (out / MARKER).write_text(json.dumps({"tool": tool, "files": files}, indent=1) + "\n")


@contextlib.contextmanager
def replacing(label: str, out, tool: str, overwrite: bool) -> Iterator[pathlib.Path]:
  """A local directory in which `tool` writes its new output for `out`, after
  check_replaceable: an earlier output of `tool` there is set aside meanwhile, and deleted,
  with the new output marked as `tool`'s, once the body succeeds; if the body fails, its
  partial output is deleted and the earlier one put back. A gs:// `out` is written
  locally and uploaded at the end (its earlier files deleted first)."""
  check_replaceable(label, out, tool, overwrite)
  out = paths.as_path(out)
  if paths.is_url(out):
    with tempfile.TemporaryDirectory(prefix="jaxencoder-") as local:
      yield pathlib.Path(local)
      mark(local, tool)
      if out.exists():
        out.rmtree()
      paths.copy_tree(local, out, last=MARKER)
    return
  out, existed = pathlib.Path(out), out.exists()
  aside = (pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.earlier.", dir=out.parent))
           if existed and any(out.iterdir()) else None)
  if aside is not None:
    out.rename(aside / out.name)
  try:
    out.mkdir(parents=True, exist_ok=True)
    yield out
    mark(out, tool)
  except BaseException:
    shutil.rmtree(out, ignore_errors=True)
    if aside is not None:
      (aside / out.name).rename(out)
    elif existed:
      out.mkdir()  # the empty directory it was
    raise
  finally:
    if aside is not None:
      shutil.rmtree(aside, ignore_errors=True)
