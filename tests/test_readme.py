"""The README's Python examples run as written."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_examples_run_and_print_what_they_promise():
  blocks = python_blocks()
  assert blocks, "README has no python examples"
  printed = io.StringIO()
  namespace: dict = {}
  with contextlib.redirect_stdout(printed):
    for block in blocks:
      exec(compile(block, str(README), "exec"), namespace)
  lines = printed.getvalue().splitlines()
  assert "(1, 7, 128)" in lines and "(1, 128)" in lines
  assert "(1, 7, 384)" in lines and "(6, 12, 7, 7)" in lines
  similarity = float(next(l for l in lines if l.startswith("cosine similarity")).split()[-1])
  assert 0.3 < similarity < 1.0
