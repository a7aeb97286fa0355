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
         "jaxencoder-compile": "jaxencoder.aot", "jaxencoder-export": "jaxencoder.export"}


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
