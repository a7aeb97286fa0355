"""Checks every internal link of a built HTML site: its file exists and its #anchor is an id there.

  python tools/check_docs_links.py docs/_build/html

Prints each broken link as `page: href (why)` and exits 1 if there is any; links with a
scheme (https:, mailto:) are not followed, and the theme's files under _static/ are not pages. `make docs` runs it after sphinx-build.
"""

from __future__ import annotations

import argparse
import html.parser
import pathlib
import sys
import urllib.parse


# Not pages: the theme's own template fragments ({{ pathto(...) }}) and the page sources.
SKIPPED = ("_static", "_sources")


class Page(html.parser.HTMLParser):
  """The hrefs (and srcs) a page links to and the ids (and names) it defines."""

  def __init__(self):
    super().__init__()
    self.links: list[str] = []
    self.ids: set[str] = set()

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    for key in ("id", "name") if tag == "a" else ("id",):
      if attrs.get(key):
        self.ids.add(attrs[key])
    target = attrs.get("href") if tag in ("a", "link") else attrs.get("src")
    if target:
      self.links.append(target)


def read(path: pathlib.Path) -> Page:
  page = Page()
  page.feed(path.read_text(errors="replace"))
  return page


def broken_links(site: pathlib.Path) -> list[str]:
  """`page: href (why)` for each internal link of the site's pages that does not resolve."""
  pages = {p.resolve(): read(p) for p in sorted(site.rglob("*.html"))
           if not p.relative_to(site).parts[0] in SKIPPED}
  problems = []
  for path, page in pages.items():
    for href in page.links:
      url = urllib.parse.urlsplit(href)
      if url.scheme or url.netloc or href.startswith("//"):
        continue
      target = (path.parent / urllib.parse.unquote(url.path)).resolve() if url.path else path
      if target.is_dir():
        target = target / "index.html"
      where = f"{path.relative_to(site.resolve())}: {href}"
      if not target.is_file():
        problems.append(f"{where} (no file {target.relative_to(site.resolve().parent)})"
                        if target.is_relative_to(site.resolve().parent) else f"{where} (no file)")
      elif url.fragment and target.suffix == ".html":
        ids = pages[target].ids if target in pages else read(target).ids
        if urllib.parse.unquote(url.fragment) not in ids:
          problems.append(f"{where} (no #{url.fragment} in {target.name})")
  return problems


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("site", type=pathlib.Path, help="the built HTML folder")
  args = parser.parse_args(argv)
  if not (args.site / "index.html").is_file():
    print(f"{args.site}: no index.html (build the site first: make docs)")
    return 1
  problems = broken_links(args.site)
  for problem in problems:
    print(problem)
  print(f"{len(problems)} broken internal links")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
