"""Sphinx configuration of the jaxencoder site (`make docs` builds it into docs/_build/html)."""

import importlib.util
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]  # the checkout's jaxencoder; our extension

project = "jaxencoder"
author = "the jaxencoder authors"
copyright = "2026, the jaxencoder authors"

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the colab/ notebooks as executed pages
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "cli_reference",  # docs/_ext/cli_reference.py: each tool's --help, rendered at build time
    "plain_docstrings",  # docs/_ext/plain_docstrings.py: prose docstrings shown as written
]

# Not pages: the build, the notebook cache, and colab/README.md seen through the notebooks link.
exclude_patterns = ["_build", ".jupyter_cache", "notebooks/README.md",
                    "results_table.md"]  # included by results.md

# MyST: GitHub-style anchors for headings, so `training.md#cloud-storage` works on GitHub and here.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Notebooks (docs/notebooks -> ../colab): executed once, then served from the cache until a
# code cell changes. Execution runs in docs/notebooks, which is colab/, so each notebook's
# first cell moves to the repository root as under `make notebooks`.
nb_execution_mode = "cache"
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True

# API reference: one page per package and module, from their docstrings (docs/api.md).
autosummary_generate = True
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures stay short; the docstrings say what a value is


def drop_stale_api_pages(app) -> None:
  """Deletes generated API pages of modules that no longer exist (moved or removed), which
  would otherwise fail to import and stop the build; autosummary then writes the rest."""
  for page in (DOCS / "_api").glob("*.rst"):
    try:
      found = importlib.util.find_spec(page.stem) is not None
    except ModuleNotFoundError:  # its parent package is gone too
      found = False
    if not found:
      page.unlink()


def setup(app):
  app.connect("builder-inited", drop_stale_api_pages, priority=400)  # before autosummary's


html_theme = "sphinx_book_theme"
html_title = "jaxencoder"
html_theme_options = {
    "repository_url": "https://github.com/jaxencoder/jaxencoder",
    "use_repository_button": True,
    "path_to_docs": "docs",
}
