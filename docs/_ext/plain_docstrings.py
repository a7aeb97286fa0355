"""Docstrings written as plain text stay plain text in the API reference.

jaxencoder's docstrings are prose for a terminal (`help()`), not reStructuredText: indented
continuation lines, `|i - j|`, `*_names.py`. A docstring that parses as reST without a
complaint is rendered as reST; any other is shown verbatim as a preformatted block (its
first paragraph, the summary autosummary shows, stays prose when it parses alone), so
the reference builds with warnings as errors and reads as the source does.
"""

from __future__ import annotations

import docutils.core
import docutils.nodes
import docutils.utils


def parses_cleanly(text: str, env=None) -> bool:
  """Whether docutils reads the text as reST with no warning or error (`env`: Sphinx's,
  which the roles Sphinx registers in docutils expect)."""
  settings = {"env": env, "report_level": docutils.utils.Reporter.WARNING_LEVEL,
              "halt_level": docutils.utils.Reporter.SEVERE_LEVEL + 1,
              "warning_stream": False, "file_insertion_enabled": False, "raw_enabled": False}
  tree = docutils.core.publish_doctree(text, settings_overrides=settings)
  warned = any(m["level"] >= docutils.utils.Reporter.WARNING_LEVEL
               for m in tree.findall(docutils.nodes.system_message))
  # A transform's error (an undefined |substitution|) leaves only a `problematic` node.
  return not warned and not any(tree.findall(docutils.nodes.problematic))


def verbatim(lines: list[str]) -> list[str]:
  return ["::", ""] + [f"   {line}" if line.strip() else "" for line in lines] + [""]


def keep_plain(app, what, name, obj, options, lines: list[str]) -> None:
  """Leaves clean reST alone; else keeps the first paragraph (autosummary's one-line summary)
  when it parses on its own, and shows the rest verbatim."""
  if not lines or parses_cleanly("\n".join(lines), app.env):
    return
  end = lines.index("") if "" in lines else len(lines)
  if parses_cleanly("\n".join(lines[:end]), app.env):
    lines[:] = lines[:end] + [""] + verbatim(lines[end:])
  else:
    lines[:] = verbatim(lines)


def setup(app):
  app.connect("autodoc-process-docstring", keep_plain)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
