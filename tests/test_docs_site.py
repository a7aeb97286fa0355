"""The docs site's sources hold together: toctrees name pages that exist, every page is in a
toctree, relative links (README.md and docs/*.md) reach files and headings that exist, the
tool tables list every console script, and the built site's link checker
(tools/check_docs_links.py, run by `make docs`) finds what is broken on a tiny made-up site."""

import importlib.util
import pathlib
import re
import sys
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# The site's own pages (colab/ is seen through docs/notebooks); a fragment another page
# includes (results_table.md, written by bench/results.py) is not a page.
INCLUDED = {"results_table.md"}
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name not in INCLUDED)
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def load(path: pathlib.Path, name: str):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


check_links = load(REPO / "tools" / "check_docs_links.py", "check_docs_links")


def toctree_entries(page: pathlib.Path) -> list[str]:
  blocks = re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), flags=re.DOTALL)
  return [line.strip() for block in blocks for line in block.splitlines()
          if line.strip() and not line.strip().startswith(":")]


def source_of(docname: str) -> pathlib.Path | None:
  """The file a toctree entry names (a page or a notebook), or None."""
  found = [DOCS / f"{docname}{ext}" for ext in (".md", ".ipynb", ".rst")]
  return next((p for p in found if p.is_file()), None)


def slug(heading: str) -> str:
  """The anchor MyST (myst_heading_anchors) and GitHub give a heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # no "# comments" of code
  return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def relative_links(page: pathlib.Path) -> list[str]:
  text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
  targets = re.findall(r"\]\(([^)\s]+)\)", text)
  return [t for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_toctree_entry_is_a_page_and_every_page_is_in_a_toctree():
  entries = [e for page in PAGES for e in toctree_entries(page)]
  assert [e for e in entries if source_of(e) is None] == []
  assert len(entries) == len(set(entries))
  in_tree = {source_of(e) for e in entries} | {DOCS / "index.md"}
  assert [p.name for p in PAGES if p not in in_tree] == []
  assert sorted(p.stem for p in (REPO / "colab").glob("*.ipynb")) == sorted(
      e.split("/")[1] for e in entries if e.startswith("notebooks/"))


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_its_heading(page):
  broken = []
  for link in relative_links(page):
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve()
    if not target.exists():
      broken.append(f"{link} (no file)")
    elif anchor and target.suffix == ".md" and anchor not in anchors(target):
      broken.append(f"{link} (no heading #{anchor})")
  assert broken == []


def test_the_readme_stays_short_and_links_into_the_site():
  readme = (REPO / "README.md").read_text()
  assert len(readme.splitlines()) <= 200
  linked = {pathlib.Path(t.partition("#")[0]).name for t in relative_links(REPO / "README.md")}
  guides = {"getting_started.md", "own_data.md", "probing.md", "training.md", "results.md",
            "cli.md", "api.md", "architecture.md", "notebooks.md"}
  assert guides <= linked


@pytest.mark.parametrize("page", ["README.md", "docs/getting_started.md", "docs/cli.md"])
def test_tool_tables_list_every_console_script(page):
  text = (REPO / page).read_text()
  listed = set(re.findall(r"^\| `(jaxencoder-[a-z]+)` \|", text, flags=re.MULTILINE))
  assert listed == set(SCRIPTS)


def test_the_cli_reference_renders_every_tools_help():
  cli_reference = load(DOCS / "_ext" / "cli_reference.py", "cli_reference")
  text = cli_reference.reference()
  for name in SCRIPTS:
    assert f"## {name}\n" in text and f"usage: {name}" in text
  assert "usage: jaxencoder-data prepare" in text  # sub-commands too
  assert "python -m jaxencoder.probing" in text and "__main__" not in text.split("(module")[0]


def write(path: pathlib.Path, body: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f"<html><body>{body}</body></html>")


def test_the_link_checker_reports_missing_files_and_anchors_only(tmp_path):
  write(tmp_path / "index.html", '<h1 id="top">x</h1><a href="guide.html#usage">ok</a>'
        '<a href="https://example.com/x">external</a><a href="#top">self</a>'
        '<a href="sub/">dir</a><img src="_static/logo.png">')
  write(tmp_path / "guide.html", '<section id="usage"></section><a href="index.html#gone">bad '
        'anchor</a><a href="missing.html">bad file</a><a href="index.html">ok</a>')
  write(tmp_path / "sub" / "index.html", '<a href="../guide.html#usage">ok</a>')
  write(tmp_path / "_static" / "theme.html", '<a href="{{ pathto(x) }}">a template</a>')
  (tmp_path / "_static" / "logo.png").write_bytes(b"png")
  problems = check_links.broken_links(tmp_path)
  assert sorted(p.split(" (")[0] for p in problems) == ["guide.html: index.html#gone",
                                                        "guide.html: missing.html"]
  assert check_links.main([str(tmp_path)]) == 1
  write(tmp_path / "guide.html", '<section id="usage"></section><a href="index.html#top">fixed</a>')
  assert check_links.main([str(tmp_path)]) == 0
