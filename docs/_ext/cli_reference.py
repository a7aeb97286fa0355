"""The CLI reference page (cli.md), written at build time from each tool's own parser.

Every console script in pyproject.toml's [project.scripts] lives in a module with a
`build_parser()`; its `format_help()` (and each sub-command's) is appended to cli.md's
source as it is read, so the page cannot drift from the flags the tools accept.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import tomllib

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
WIDTH = "96"  # argparse wraps help at $COLUMNS: fixed, so the page is the same on any terminal


def scripts() -> dict[str, str]:
  """Console script -> its module, in pyproject.toml's order."""
  table = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]
  return {name: target.split(":")[0] for name, target in table.items()}


def module_twin(module: str) -> str:
  """The `python -m` spelling of a script's module."""
  return "python -m " + module.removesuffix(".__main__")


def helps(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
  """(prog, help text) of a parser and of each of its sub-commands, in order."""
  found = [(parser.prog, parser.format_help())]
  for action in parser._actions:  # argparse exposes sub-parsers only through its actions
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        found += helps(sub)
  return found


def tool_section(name: str, module: str) -> str:
  parser = importlib.import_module(module).build_parser()
  parts = [f"## {name}\n\n`{name}`, also `{module_twin(module)}` (module `{module}`).\n"]
  for prog, text in helps(parser):
    heading = "" if prog == parser.prog else f"### {prog}\n\n"
    parts.append(f"{heading}```text\n{text.rstrip()}\n```\n")
  return "\n".join(parts)


def reference() -> str:
  old = os.environ.get("COLUMNS")
  os.environ["COLUMNS"] = WIDTH
  try:
    return "\n".join(tool_section(name, module) for name, module in scripts().items())
  finally:
    if old is None:
      del os.environ["COLUMNS"]
    else:
      os.environ["COLUMNS"] = old


def append_reference(app, docname: str, source: list[str]) -> None:
  if docname == "cli":
    source[0] = source[0].rstrip("\n") + "\n\n" + reference()


def setup(app):
  app.connect("source-read", append_reference)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
