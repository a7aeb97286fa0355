"""The package's import graph, by folder: which module imports which (read with ast, no
imports run). `python tools/import_graph.py [PACKAGE_DIR]` prints modules per folder and
the arrows that cross folders; tests/test_package_layers.py checks their directions.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package_dir: pathlib.Path) -> dict[str, set[str]]:
  """{module: modules of the package it imports} (`from a import b` counts a.b when b is
  a module of the package, else a)."""
  files = sorted(package_dir.rglob("*.py"))
  modules = {module_name(f, package_dir) for f in files}
  root = package_dir.name
  graph = {}
  for f in files:
    found = set()
    for node in ast.walk(ast.parse(f.read_text())):
      if isinstance(node, ast.Import):
        found |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        subs = {f"{node.module}.{a.name}" for a in node.names} & modules
        found |= subs or {node.module}
    graph[module_name(f, package_dir)] = {m for m in found if m.split(".")[0] == root}
  return graph


def folder(module: str) -> str:
  """'jaxencoder.train.loop' and 'jaxencoder.train' -> 'train'; a top-level module
  ('jaxencoder.cli') by its name; the package itself -> 'package'."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "package"


def summary(package_dir: pathlib.Path) -> str:
  graph = imports(package_dir)
  per_folder = collections.Counter(folder(m) for m in graph)
  arrows = collections.Counter((folder(a), folder(b)) for a, targets in graph.items()
                               for b in targets if folder(a) != folder(b))
  lines = ["modules per folder: " + ", ".join(f"{k} {v}" for k, v in sorted(per_folder.items()))]
  lines += [f"  {a} -> {b}: {n} imports" for (a, b), n in sorted(arrows.items())]
  return "\n".join(lines)


if __name__ == "__main__":
  print(summary(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "jaxencoder").resolve()))
