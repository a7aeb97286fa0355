"""docs/own_data.md "Recipes": each recipe's commands run as written, on tiny made-up files.

Only the training steps are shrunk (flags appended to the `jaxencoder-train` line), so a
recipe takes seconds of training instead of minutes.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "own_data.md"
TINY = ("--config.num_train_steps=2 --config.eval_every=2 --config.checkpoint_every=2 "
        "--config.log_every=1 --config.batch_size=4 --config.eval_batch_size=4 "
        "--config.progress_bar=false")


def recipes() -> list[list[str]]:
  """The bash blocks under "## Recipes", each a list of its commands."""
  section = PAGE.read_text().split("## Recipes\n", 1)[1].split("\n## ", 1)[0]
  blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
  return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def sentences(n: int) -> list[str]:
  words = "the cat sat on a mat while a dog ran far away from the quick brown fox".split()
  return [" ".join(words[(i + k) % len(words)] for k in range(4 + i % 5)) for i in range(n)]


def made_up_files(root: pathlib.Path) -> None:
  """my_texts/ (two .txt files), my_csvs/{train,test}.csv and my_tags/tags.txt (one file)."""
  (root / "my_texts").mkdir()
  for f in range(2):
    (root / "my_texts" / f"part{f}.txt").write_text("\n\n".join(sentences(30)) + "\n")
  (root / "my_csvs").mkdir()
  for split, n in (("train", 24), ("test", 8)):
    rows = [f"{text},{'good' if i % 2 else 'bad'}" for i, text in enumerate(sentences(n))]
    (root / "my_csvs" / f"{split}.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
  (root / "my_tags").mkdir()
  tagged = [" ".join(f"{w}/{'DT' if w in ('the', 'a') else 'NN'}" for w in s.split())
            for s in sentences(24)]
  (root / "my_tags" / "tags.txt").write_text("\n".join(tagged) + "\n")
  (root / "configs").symlink_to(REPO / "configs")


def run(command: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  if command.startswith("jaxencoder-train"):
    command = f"{command} {TINY}"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", JAXENCODER_PROGRESS="off",
             PATH=f"{pathlib.Path(sys.executable).parent}:{env['PATH']}")
  result = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
  assert result.returncode == 0, (command, result.stderr[-3000:])
  return result


def test_the_section_has_three_recipes_of_at_most_three_commands():
  assert [len(r) for r in recipes()] == [3, 2, 2]


@pytest.mark.slow
@pytest.mark.parametrize("index, dataset", [(0, "text_corpus/mine"),
                                            (1, "text_classification/reviews"),
                                            (2, "tagged_tokens/tags")])
def test_a_recipe_runs_as_written(tmp_path, index, dataset):
  made_up_files(tmp_path)
  printed = [run(command, tmp_path).stdout for command in recipes()[index]]
  prepare = next(out for out in printed if "dataset: " in out).splitlines()
  assert prepare[-1] == f"dataset: {tmp_path}/data/tfds/{dataset}/1.0.0"
  workdir = tmp_path / recipes()[index][-1].split("--workdir ")[1].split()[0]
  assert (workdir / "metrics.jsonl").exists()
  assert any(p.name.isdigit() for p in (workdir / "checkpoints").iterdir())
