"""Public names of a package imported on first use (PEP 562), so that importing a tool's
module (and its --help) loads no JAX or Flax."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable, Collection


class _MovedModules(importlib.abc.MetaPathFinder):
  """Last on `sys.meta_path`: a module that moved (old dotted name -> new) fails to import
  with one line naming its new path, instead of a bare ModuleNotFoundError."""

  def __init__(self, new_path: dict[str, str]):
    self.new_path = new_path

  def find_spec(self, fullname, path=None, target=None):
    if fullname in self.new_path:  # ImportError, not ModuleNotFoundError: `from x import y` re-raises it
      raise ImportError(f"{fullname} moved: import {self.new_path[fullname]}")
    return None


def lazy_exports(package: str, module_of: dict[str, str], namespace: dict,
                 modules: Collection[str] = (),
                 moved: dict[str, str] | None = None) -> tuple[Callable, Callable]:
  """(`__getattr__`, `__dir__`) for `package`: name -> `package.<module_of[name]>`'s
  attribute of that name, or the module itself for names in `modules`; each cached in
  `namespace` (the package's globals) once imported. `moved`: old submodule name -> its
  new dotted path; importing or reading one fails in one line naming the new path."""
  moved = moved or {}
  if moved:
    sys.meta_path.append(_MovedModules({f"{package}.{old}": new for old, new in moved.items()}))

  def getattr_(name: str):
    if name in moved:
      raise AttributeError(f"{package}.{name} moved: import {moved[name]}")
    if name not in module_of:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(f"{package}.{module_of[name]}")
    value = module if name in modules else getattr(module, name)
    namespace[name] = value
    return value

  def dir_() -> list[str]:
    return sorted(set(namespace) | set(module_of))

  return getattr_, dir_
