"""Imports sit at the top of a module, where the import graph can be read. One inside a
function stays only with a `# lazy: REASON` comment, on its line or on the line above the
run of imports it opens, REASON one of:

  --help stays fast            a CLI module, or one a CLI imports at startup, putting off
                               JAX / orbax / grain / matplotlib until a command runs
  optional extra NAME (...)    a pyproject optional-dependencies extra (or a package
                               installed apart): the rest works without it
  tasks import without grain   the tasks and the train step load without the input
                               pipeline (test_package_layers: bench's accelerator image)
  import cycle: A <-> B        not yet untangled (the aim is none)
"""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
REASONS = ("--help stays fast", "optional extra ", "tasks import without grain",
           "import cycle: ")
MARK = "# lazy:"


def parse(source: str) -> ast.Module:
  """ast.parse, tried again on CPython 3.11.7's "AST constructor recursion depth mismatch"
  SystemError (seen once in `make test`): a race on the AST converter's recursion counter
  (CPython gh-106905), which another thread of the test process can hit at the same time,
  e.g. formatting a background task's traceback (3.11's tracebacks parse source lines)."""
  for attempt in range(3):
    try:
      return ast.parse(source)
    except SystemError:
      if attempt == 2:
        raise


def _reason(line: str) -> str | None:
  """The text after `# lazy:` on `line`, stripped; None without the mark."""
  at = line.find(MARK)
  return None if at < 0 else line[at + len(MARK):].strip()


def _inner_imports(tree: ast.Module) -> dict[int, tuple[ast.stmt, str]]:
  """{first line: (import statement, its function's name)} for imports inside functions."""
  found = {}
  for fn in ast.walk(tree):
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(fn):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          found.setdefault(node.lineno, (node, fn.name))
  return found


def _comment_above(lines: list[str], node: ast.stmt, inner: dict) -> str | None:
  """The reason of the comment line above the run of inner imports `node` ends."""
  ends = {n.end_lineno: n for n, _ in inner.values()}
  row = node.lineno - 1  # 1-based line numbers: lines[row - 1] is the line above
  while row in ends:
    row = ends[row].lineno - 1
  above = lines[row - 1].strip() if row >= 1 else ""
  return _reason(above) if above.startswith("#") else None


def unexplained_lazy_imports(package_dir: pathlib.Path) -> list[str]:
  """'file:line: why' for each import inside a function without a known `# lazy:` reason."""
  problems = []
  for path in sorted(package_dir.rglob("*.py")):
    lines = path.read_text().splitlines()
    inner = _inner_imports(parse("\n".join(lines)))
    for lineno, (node, fn) in sorted(inner.items()):
      own = [_reason(l) for l in lines[lineno - 1:node.end_lineno]]
      reason = next((r for r in own if r is not None), None)
      if reason is None:
        reason = _comment_above(lines, node, inner)
      where = f"{path.relative_to(package_dir.parent)}:{lineno}"
      if reason is None:
        problems.append(f"{where}: import inside {fn}() without a '{MARK} REASON' comment")
      elif not reason.startswith(REASONS):
        problems.append(f"{where}: '{MARK} {reason}' is not a known reason {REASONS}")
  return problems


def test_every_import_inside_a_function_says_why():
  assert unexplained_lazy_imports(REPO / "jaxencoder") == []


def test_the_check_catches_an_import_without_a_reason(tmp_path):
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "tool.py").write_text(
      "import os\n\n\n"
      "def main():\n"
      "  # lazy: --help stays fast\n"
      "  import jax\n"
      "  from jax import numpy as jnp, lax\n"
      "  import json\n"
      "  return os, jax, jnp, lax, json\n\n\n"
      "def plot():\n"
      "  x = 1\n"
      "  import matplotlib  # lazy: the backend\n"
      "  import torch  # lazy: optional extra parity (torch)\n"
      "  from pkg import (\n"
      "      other)  # lazy: import cycle: pkg.tool <-> pkg.other\n"
      "  return x, matplotlib, torch, other\n")
  (package / "other.py").write_text("def f():\n  # a comment, not a reason\n  import re\n")
  assert unexplained_lazy_imports(package) == [
      "pkg/other.py:3: import inside f() without a '# lazy: REASON' comment",
      "pkg/tool.py:14: '# lazy: the backend' is not a known reason " + str(REASONS)]
