"""Command-line tools: each console script and its `python -m` twin run the same main."""

import importlib
import pathlib
import subprocess
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# console script -> the `python -m` module documented as its twin
TWINS = {"jaxencoder-train": "jaxencoder.train", "jaxencoder-data": "jaxencoder.data",
         "jaxencoder-convert": "jaxencoder.pretrained", "jaxencoder-probe": "jaxencoder.probing",
         "jaxencoder-tokenizer": "jaxencoder.tokenizer",
         "jaxencoder-predict": "jaxencoder.train.predict", "jaxencoder-plot": "jaxencoder.train.plots",
         "jaxencoder-compile": "jaxencoder.aot", "jaxencoder-export": "jaxencoder.export",
         "jaxencoder-eval": "jaxencoder.retrieval"}


def test_every_tool_has_a_script_and_a_twin():
  assert sorted(SCRIPTS) == sorted(TWINS)
  for script, target in SCRIPTS.items():
    module, func = target.split(":")
    twin = TWINS[script]
    single_file = twin in ("jaxencoder.tokenizer", "jaxencoder.train.predict",
                           "jaxencoder.train.plots")
    main_module = twin if single_file else f"{twin}.__main__"
    assert module == main_module, script
    assert callable(getattr(importlib.import_module(module), func))


@pytest.mark.slow
@pytest.mark.parametrize("script", ["jaxencoder-train", "jaxencoder-convert", "jaxencoder-probe",
                                    "jaxencoder-compile"])
def test_installed_script_prints_its_usage(script):
  path = pathlib.Path(sys.executable).parent / script
  result = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert f"usage: {script}" in result.stdout


def moved_names() -> list[tuple[str, str, str]]:
  """(CLI module, name, new dotted path) of every library name moved out of a CLI module."""
  modules = sorted({target.split(":")[0] for target in SCRIPTS.values()})
  return [(module, name, new) for module in modules
          for name, new in getattr(getattr(importlib.import_module(module), "__getattr__", None),
                                   "new_homes", {}).items()]


def test_library_names_moved_out_of_the_cli_modules_fail_naming_their_new_home():
  moved = moved_names()
  assert ("jaxencoder.pretrained.__main__", "convert",
          "jaxencoder.pretrained.convert.convert") in moved
  for module, name, new in moved:
    with pytest.raises(ImportError, match=f"^{module}.{name} moved: use {new}$"):
      exec(f"from {module} import {name}", {})
    home, _, new_name = new.rpartition(".")
    assert hasattr(importlib.import_module(home), new_name), new

