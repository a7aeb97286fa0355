"""Every function of the package fits on a screen or two: at most 80 lines and at most 10
parameters (read with ast, nothing imported).

Lines: from the `def` line to the function's last line (decorators not counted, its
docstring and nested functions counted). Parameters: positional and keyword-only ones,
`*args` and `**kwargs` one each, `self` and `cls` not counted.
"""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES, MAX_PARAMS = 80, 10


def function_sizes(path: pathlib.Path):
  """(qualified name, lines, parameters) of every function and method in a module."""
  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = child.args
        named = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        params = len([a for a in named if a not in ("self", "cls")])
        params += (args.vararg is not None) + (args.kwarg is not None)
        yield prefix + child.name, child.end_lineno - child.lineno + 1, params
        yield from visit(child, f"{prefix}{child.name}.")
      elif isinstance(child, ast.ClassDef):
        yield from visit(child, f"{prefix}{child.name}.")
      else:
        yield from visit(child, prefix)
  yield from visit(ast.parse(path.read_text()), "")


def offenders(package_dir: pathlib.Path) -> dict[str, str]:
  """{'path::qualified name': what is over the limit} for the package's functions."""
  found = {}
  for path in sorted(package_dir.rglob("*.py")):
    for name, lines, params in function_sizes(path):
      over = ([f"{lines} lines"] if lines > MAX_LINES else []) + (
          [f"{params} parameters"] if params > MAX_PARAMS else [])
      if over:
        found[f"{path.relative_to(package_dir.parent)}::{name}"] = ", ".join(over)
  return found


def test_no_function_is_over_80_lines_or_10_parameters():
  found = offenders(REPO / "jaxencoder")
  assert not found, "over 80 lines or 10 parameters:\n" + "\n".join(
      f"  {name}: {why}" for name, why in sorted(found.items()))


def test_the_size_check_counts_lines_and_parameters(tmp_path):
  module = tmp_path / "pkg" / "m.py"
  module.parent.mkdir()
  module.write_text(
      "class A:\n"
      "  @staticmethod\n"
      "  def wide(self, a, b, c, d, e, f, g, h, i, *args, j, **kwargs):\n"
      "    pass\n"
      "  def fits(self, a, b, c, d, e, f, g, h, i, j):\n"
      "    pass\n\n"
      "def long():\n" + "  x = 1\n" * 80 + "  def inner(a):\n    return a\n")
  sizes = {name: (lines, params) for name, lines, params in function_sizes(module)}
  assert sizes == {"A.wide": (2, 12), "A.fits": (2, 10), "long": (83, 0),
                   "long.inner": (2, 1)}
  assert offenders(tmp_path / "pkg") == {"pkg/m.py::A.wide": "12 parameters",
                                         "pkg/m.py::long": "83 lines"}
