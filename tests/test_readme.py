"""The README's Python examples run as written, each on its own (as a reader copies one)."""

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def run_block(block: str, cwd: pathlib.Path) -> list[str]:
  """Runs one snippet in a fresh namespace; its printed lines."""
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed), contextlib.chdir(cwd):
    exec(compile(block, str(README), "exec"), {})
  return printed.getvalue().splitlines()


def promised(block: str) -> list[str]:
  """What a snippet's `print(...)  # value` comments say it prints."""
  return [line.split("#", 1)[1].strip() for line in block.splitlines()
          if line.startswith("print(") and "#" in line]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A 300-step run as `make train` leaves it, for the RunDir snippet (made small and fast)."""
  import train_helpers as th
  from jaxencoder.train.loop import train_and_evaluate
  root = tmp_path_factory.mktemp("readme")
  config = th.tiny_config(root, th.text_corpus(root), th.write_vocab(root))
  config.num_train_steps, config.checkpoint_every, config.eval_every = 300, 300, 300
  config.log_every = 300
  train_and_evaluate(config, root / "runs" / "default")
  return root


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_example_runs_alone_and_prints_what_it_promises(index, run_dir):
  block = python_blocks()[index]
  lines = run_block(block, run_dir)
  for expected in promised(block):
    assert any(line.startswith(expected) for line in lines), (expected, lines)
  if "cosine similarity" in block:
    similarity = float(next(l for l in lines if l.startswith("cosine similarity")).split()[-1])
    assert 0.3 < similarity < 1.0
