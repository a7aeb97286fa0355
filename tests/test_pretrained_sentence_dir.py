"""Live (make parity): sentence-transformers loads a converted run as it was trained.

`SentenceTransformer(DIR).encode` of a run written by `jaxencoder-convert --from RUN --to
DIR` against `jaxencoder.load(RUN).embed` and `jaxencoder-predict`, on texts shorter and
longer than the run's data.seq_len; and docs/export.md's round trip, run as written (tiny
training overrides added). Skips without torch and sentence-transformers (make parity
installs them; its --no-skips makes a skip fail there).
"""

import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

import jaxencoder
from jaxencoder.export.sentence_dir import convert
from jaxencoder.train import predict
from jaxencoder.train.config_file import load_config
from test_configs import REPO, TINY, data_overrides
from test_sentence_dir import LONG, SEQ_LEN, SHORT, min_cosine, train_contrastive


@pytest.fixture(scope="module")
def sentence_transformers():
  pytest.importorskip("torch")
  return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """A 1-step contrastive run and its sentence-transformers directory: (RUN, DIR)."""
  root = tmp_path_factory.mktemp("st_live")
  run = train_contrastive(root)
  convert(run, root / "st")
  return run, root / "st"


def cosines(sentence_transformers, run, out, texts) -> tuple[float, float]:
  """(min cosine against load(RUN).embed, against jaxencoder-predict) of encode(texts)."""
  model = sentence_transformers.SentenceTransformer(str(out), device="cpu")
  assert model.max_seq_length == SEQ_LEN
  theirs_NxD = model.encode(texts, convert_to_numpy=True)
  np.testing.assert_allclose(np.linalg.norm(theirs_NxD, axis=-1), 1.0, atol=1e-5)  # Normalize
  return (min_cosine(theirs_NxD, jaxencoder.load(run).embed(texts)),
          min_cosine(theirs_NxD, predict.predict(predict.load(run), texts)))


def test_live_encode_of_a_converted_contrastive_run_is_its_embed_and_predict(
    sentence_transformers, converted):
  run, out = converted
  lengths_N = jaxencoder.load(run).tokenizer.encode_batch(LONG)["attention_mask"].sum(-1)
  assert (lengths_N > SEQ_LEN).all()
  for name, texts in (("short", SHORT), ("long", LONG)):
    embed_cos, predict_cos = cosines(sentence_transformers, run, out, texts)
    print(f"{name} texts: min cosine {embed_cos:.7f} (embed), {predict_cos:.7f} (predict)")
    assert embed_cos >= 0.9999 and predict_cos >= 0.9999


@pytest.mark.slow
def test_live_a_run_with_berts_pooler_encodes_through_its_dense_module(
    sentence_transformers, tmp_path):
  run = train_contrastive(tmp_path, "model.pooling=cls", "model.pooler_dense=true")
  convert(run, tmp_path / "st")
  model = sentence_transformers.SentenceTransformer(str(tmp_path / "st"), device="cpu")
  assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Dense", "Normalize"]
  embed_cos, _ = cosines(sentence_transformers, run, tmp_path / "st", SHORT + LONG)
  assert embed_cos >= 0.9999


def round_trip_block() -> str:
  """docs/export.md's bash block that converts a run for sentence-transformers."""
  page = (REPO / "docs" / "export.md").read_text()
  blocks = [b for b in re.findall(r"```bash\n(.*?)```", page, flags=re.DOTALL)
            if "SentenceTransformer(" in b]
  assert len(blocks) == 1, "docs/export.md: one bash block with the round trip"
  return blocks[0]


@pytest.mark.slow
def test_live_the_docs_round_trip_runs_as_written(sentence_transformers, tmp_path):
  """Each line as written (`python` this interpreter, jaxencoder-convert its module), the
  train.py line with tests/test_configs.py's tiny overrides on data made here."""
  config = load_config(str(REPO / "configs" / "contrastive.py"))
  tiny = [f"--config.{o}" for o in TINY + data_overrides(config, tmp_path)]
  printed = []
  for line in round_trip_block().strip().splitlines():
    argv = shlex.split(line, comments=True)
    if argv[:2] == ["python", "train.py"]:
      argv = argv + tiny
    if argv[0] == "jaxencoder-convert":
      argv = ["python", "-m", "jaxencoder.pretrained"] + argv[1:]
    argv = [sys.executable if a == "python" else a for a in argv]
    argv = [str(REPO / a) if a in ("train.py", "configs/contrastive.py") else a for a in argv]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, (line, done.stderr[-3000:])
    printed.append(done.stdout)
  assert printed[-1].strip() == "(2, 32)"  # 2 texts, the tiny model's width
