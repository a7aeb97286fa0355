"""Public names of a package imported on first use (PEP 562), so that importing a tool's
module (and its --help) loads no JAX or Flax."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection


def lazy_exports(package: str, module_of: dict[str, str], namespace: dict,
                 modules: Collection[str] = ()) -> tuple[Callable, Callable]:
  """(`__getattr__`, `__dir__`) for `package`: name -> `package.<module_of[name]>`'s
  attribute of that name, or the module itself for names in `modules`; each cached in
  `namespace` (the package's globals) once imported."""
  def getattr_(name: str):
    if name not in module_of:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(f"{package}.{module_of[name]}")
    value = module if name in modules else getattr(module, name)
    namespace[name] = value
    return value

  def dir_() -> list[str]:
    return sorted(set(namespace) | set(module_of))

  return getattr_, dir_
