"""The Python examples of the README and the docs site run as written, each on its own (as a
reader copies one): every ```python block of README.md and docs/**/*.md."""

import contextlib
import io
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def pages() -> list[pathlib.Path]:
  """README.md and the site's Markdown pages (not the build, not colab/ seen through the link)."""
  docs = [p for p in sorted((REPO / "docs").rglob("*.md"))
          if p.relative_to(REPO / "docs").parts[0] not in ("_build", "_api", "notebooks")]
  return [REPO / "README.md", *docs]


def python_blocks() -> list[tuple[str, str]]:
  """(page:index, code) of each ```python block."""
  return [(f"{page.relative_to(REPO)}:{i}", block) for page in pages()
          for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(),
                                               flags=re.DOTALL))]


def run_block(block: str, cwd: pathlib.Path, where: str = "README.md") -> list[str]:
  """Runs one snippet in a fresh namespace; its printed lines."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed), contextlib.chdir(cwd):
    exec(compile(block, where, "exec"), {})
  return printed.getvalue().splitlines()


def promised(block: str) -> list[str]:
  """What a snippet's `print(...)  # value` comments say it prints."""
  return [line.split("#", 1)[1].strip() for line in block.splitlines()
          if line.startswith("print(") and "#" in line]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A 300-step run as `make train` leaves it, for the RunDir snippet (docs/probing.md; made
  small and fast)."""
  import train_helpers as th
  from jaxencoder.train.loop import train_and_evaluate
  root = tmp_path_factory.mktemp("readme")
  config = th.tiny_config(root, th.text_corpus(root), th.write_vocab(root))
  config.num_train_steps, config.checkpoint_every, config.eval_every = 300, 300, 300
  config.log_every = 300
  train_and_evaluate(config, root / "runs" / "default")
  return root


def test_the_readme_and_the_guides_have_their_examples():
  where = [name.split(":")[0] for name, _ in python_blocks()]
  assert {"README.md", "docs/getting_started.md", "docs/model.md", "docs/pretrained.md",
          "docs/probing.md", "docs/tasks.md"} <= set(where)
  assert all(promised(block) for _, block in python_blocks())  # each says what it prints


@pytest.mark.slow
@pytest.mark.parametrize("where, block", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_example_runs_alone_and_prints_what_it_promises(where, block, run_dir):
  lines = run_block(block, run_dir, where)
  for expected in promised(block):
    assert any(line.startswith(expected) for line in lines), (expected, lines)
  if "cosine similarity" in block:
    similarity = float(next(l for l in lines if l.startswith("cosine similarity")).split()[-1])
    assert 0.3 < similarity < 1.0
