"""Cloud Storage (gs://) paths end to end, against a local emulator (tests/gcs_emulator.py)."""

import itertools
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import train_helpers as th
from data_helpers import VOCAB, WORDS
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder import tokenizer
from jaxencoder.data import builders, sources
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io.paths import as_path, copy_tree
from jaxencoder.tokenizer import Tokenizer
from jaxencoder.train.config import finalize
from jaxencoder.train.metrics import MetricWriter, read_metrics
from jaxencoder.train.datasets import make_pipelines

REPO = pathlib.Path(__file__).resolve().parents[1]


def no_local_gs_dir(*roots) -> bool:
  """pathlib.Path("gs://b/x") would have made a directory "gs:" in the working directory."""
  return not any((pathlib.Path(root) / "gs:").exists() for root in (os.getcwd(), REPO, *roots))


def test_a_url_stays_a_url_and_round_trips(gcs):
  path = as_path(gcs.url("epath/a.txt"))
  assert str(path) == gcs.url("epath/a.txt")
  path.write_text("hello")
  assert path.read_text() == "hello" and path.parent.is_dir()
  assert gcs.objects("epath/") == ["epath/a.txt"]
  assert no_local_gs_dir()


def test_checkpointer_restores_a_sharded_state_from_gcs(gcs):
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharding = NamedSharding(mesh, P("data"))
  def state(seed):
    w = jax.random.normal(jax.random.key(seed), (8 * jax.device_count(), 4))
    return {"w": jax.device_put(w, sharding), "step": jnp.int32(seed)}
  with Checkpointer(gcs.url("ckpt"), save_interval_steps=1, max_to_keep=1) as ckpt:
    for step in (1, 2):
      ckpt.save(step, state(step), data_state={"next": step}, config={"lr": 0.1})
    ckpt.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state(0))
  with Checkpointer(gcs.url("ckpt"), save_interval_steps=1, max_to_keep=1) as ckpt:
    assert ckpt.all_steps() == [2]  # step 1 deleted by retention, on GCS too
    restored, data, config = ckpt.restore(abstract_state=abstract)
  jax.tree.map(np.testing.assert_array_equal, restored, state(2))
  assert restored["w"].sharding == sharding
  assert (data, config) == ({"next": 2}, {"lr": 0.1})
  names = gcs.objects("ckpt/")
  assert "ckpt/2/commit_success.txt" in names and not any(n.startswith("ckpt/1/") for n in names)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("gcsdata")
  return root, th.text_corpus(root), th.write_vocab(root)


def first_batches(config, n=3):
  pipelines = make_pipelines(finalize(config))
  return (list(itertools.islice(iter(pipelines.train), n)),
          list(itertools.islice(iter(pipelines.make_eval()), n)))


def test_a_dataset_on_gcs_gives_the_batches_of_its_local_copy(gcs, corpus):
  root, _, vocab = corpus
  copy_tree(root, gcs.url("copy"))
  name = "text_corpus/corpus"  # a prepared kind/name under data_dir/tfds
  local = first_batches(th.tiny_config(root, name, vocab))
  remote = first_batches(th.tiny_config(gcs.url("copy"), name, gcs.url("copy/vocab.txt")))
  for a, b in zip(jax.tree.leaves(local), jax.tree.leaves(remote), strict=True):
    np.testing.assert_array_equal(a, b)


def test_prepare_reads_a_gcs_source_and_uploads_the_dataset(gcs):
  paragraphs = ["the cat sat", "a dog ran far away", "time flies like an arrow"]
  as_path(gcs.url("raw/a.txt")).write_text("\n\n".join(paragraphs) + "\n")
  out = builders.prepare("text_corpus", gcs.url("raw"), gcs.url("prepared"), name="p")
  assert str(out) == gcs.url("prepared/text_corpus/p/1.0.0")
  names = gcs.objects("prepared/")
  assert "prepared/text_corpus/p/1.0.0/dataset_info.json" in names
  assert any(n.endswith(".array_record-00000-of-00001") for n in names)
  src = sources.open_source(str(out))
  texts = sorted(src[i]["text"].decode() for i in range(len(src)))
  assert texts == sorted(paragraphs)
  assert {src[i]["origin"].decode().split(":")[0] + ":" for i in range(len(src))} == {"gs:"}
  assert no_local_gs_dir()


def test_metrics_on_gcs_append_across_writers(gcs):
  workdir = gcs.url("metrics")
  writer = MetricWriter(workdir)
  writer.write(1, "train", {"loss": 2.0})
  writer.write(2, "train", {"loss": 1.5})
  writer.close()
  writer = MetricWriter(workdir)  # a resumed run keeps the rows before it
  writer.write(3, "eval", {"loss": 1.0})
  writer.close()
  rows = read_metrics(workdir)
  assert [(r["step"], r["split"], r["loss"]) for r in rows] == [
      (1, "train", 2.0), (2, "train", 1.5), (3, "eval", 1.0)]
  assert any(n.startswith("metrics/tensorboard/events.out.tfevents") for n in gcs.objects("metrics/"))


def test_tokenizer_saves_to_and_loads_from_gcs(gcs):
  tok = Tokenizer.from_vocab(VOCAB)
  tok.save(gcs.url("tok"))
  assert gcs.objects("tok/") == ["tok/tokenizer.json", "tok/vocab.txt"]
  text = "the quick brown fox jumps"
  for path in (gcs.url("tok"), gcs.url("tok/vocab.txt")):
    again = Tokenizer.from_file(path)
    np.testing.assert_array_equal(again.encode(text)["input_ids"], tok.encode(text)["input_ids"])


def test_tokenizer_cli_trains_on_gcs_files_and_writes_to_gcs(gcs):
  text = "\n".join(["the cat sat on the mat", "the dog ran far away"] * 20)
  as_path(gcs.url("tokcorpus/a.txt")).write_text(text)
  tokenizer.main(["train", "--input", gcs.url("tokcorpus"), "--vocab-size", "60",
                  "--out", gcs.url("trained")])
  assert gcs.objects("trained/") == ["trained/tokenizer.json", "trained/vocab.txt"]
  tok = Tokenizer.from_file(gcs.url("trained"))
  assert tok.decode(tok.encode("the cat sat")["input_ids"]) == "the cat sat"
  assert no_local_gs_dir()


# --- train.py end to end: workdir and data on GCS, killed and resumed ---------------------
TOTAL, EVERY = 12, 3
OVERRIDES = [f"--config.model.vocab_size={len(VOCAB)}", "--config.model.num_layers=1",
             "--config.model.emb_dim=32", "--config.model.num_heads=2",
             "--config.model.mlp_dim=64", "--config.model.max_len=32",
             "--config.data.seq_len=16", "--config.data.holdout_every=10",
             "--config.batch_size=8", "--config.eval_batch_size=8",
             f"--config.num_train_steps={TOTAL}", f"--config.checkpoint_every={EVERY}",
             "--config.log_every=1", f"--config.eval_every={TOTAL}",
             "--config.optim.warmup_steps=1", "--config.progress_bar=false"]


def fake_shakespeare(root: pathlib.Path) -> None:
  """A fetched-looking raw/shakespeare/ of a few plays' worth of tiny paragraphs."""
  raw = root / "raw" / "shakespeare"
  raw.mkdir(parents=True)
  rng = np.random.default_rng(0)
  words = VOCAB[9:]
  for play in ("hamlet", "lear"):
    paragraphs = [" ".join(rng.choice(words, size=rng.integers(3, 12))) for _ in range(60)]
    (raw / f"{play}_gut.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="latin-1")
  (raw / ".complete").write_text("ok\n")


def train_py(gcs, cwd):
  command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/mlm_tiny.py"),
             "--workdir", gcs.url("run"), f"--config.data.data_dir={gcs.url('data')}",
             f"--config.data.tokenizer={gcs.url('data/vocab.txt')}", *OVERRIDES]
  return subprocess.Popen(command, cwd=cwd, env={**os.environ, **gcs.env},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for_object(gcs, name, proc, timeout=240):
  deadline = time.time() + timeout
  while name not in gcs.objects(name):
    if proc.poll() is not None:
      raise AssertionError(f"run ended early:\n{proc.stdout.read().decode()[-3000:]}")
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"no {name} in time")
    time.sleep(0.05)


@pytest.mark.slow
def test_train_py_on_gcs_is_killed_and_resumes(gcs, tmp_path):
  local = tmp_path / "data"
  fake_shakespeare(local)
  builders.prepare_fetched("shakespeare", local)
  th.write_vocab(local)
  copy_tree(local, gcs.url("data"))
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  first = train_py(gcs, cwd)
  try:
    wait_for_object(gcs, f"run/checkpoints/{EVERY}/commit_success.txt", first)
    first.kill()  # SIGKILL mid-run
    first.wait()
  finally:
    if first.poll() is None:
      first.kill()
  killed_at = time.time()
  with Checkpointer(gcs.url("run/checkpoints"), save_interval_steps=1, max_to_keep=None) as c:
    saved = c.latest_step()
  assert first.returncode == -signal.SIGKILL and EVERY <= saved < TOTAL  # killed mid-run
  second = train_py(gcs, cwd)
  out = second.communicate(timeout=300)[0].decode()
  assert second.returncode == 0, out[-3000:]
  rows = [r for r in read_metrics(gcs.url("run")) if r["split"] == "train"]
  assert [r["step"] for r in rows] == list(range(1, TOTAL + 1))
  resumed = [r["step"] for r in rows if r["time"] > killed_at]
  assert resumed == list(range(saved + 1, TOTAL + 1))  # from the checkpoint, not from step 1
  names = gcs.objects("run/")
  assert f"run/checkpoints/{TOTAL}/commit_success.txt" in names
  assert "run/metrics.jsonl" in names
  assert any(n.startswith("run/tensorboard/events.out.tfevents") for n in names)
  assert list(cwd.iterdir()) == [] and no_local_gs_dir(cwd)


# Convert, probe and init_from paths on gs://.

def tiny_bert_dir(root: pathlib.Path):
  """A Hugging Face BERT directory of a tiny random encoder, and its (cfg, params)."""
  import flax.linen as nn
  import jax
  from conftest import tiny_config
  from jaxencoder import Encoder
  from jaxencoder import pretrained
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  params = nn.meta.unbox(jax.jit(Encoder(cfg).init)(jax.random.key(0),
                                                    np.ones((1, 8), np.int32))["params"])
  pretrained.save(root / "hf", cfg, params, Tokenizer.from_vocab(VOCAB))
  return cfg, params


def test_convert_reads_and_writes_gcs_and_init_from_takes_its_architecture(gcs, tmp_path):
  import jax
  from jaxencoder import pretrained
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.pretrained.convert import convert
  from jaxencoder.model.restore_targets import stored_config
  from jaxencoder.train.config import base_config
  from jaxencoder.train.init_from import adopt
  cfg, params = tiny_bert_dir(tmp_path)
  copy_tree(tmp_path / "hf", gcs.url("conv/hf"))
  convert(gcs.url("conv/hf"), gcs.url("conv/run"))  # HF on gs -> run dir on gs
  run = RunDir.open(gcs.url("conv/run"))
  assert stored_config(run) == cfg and "conv/run/tokenizer.json" in gcs.objects("conv/run/")
  config = base_config()
  config.init_from = gcs.url("conv/run")
  assert f"model.emb_dim: 128 -> {cfg.emb_dim}" in adopt(config)
  assert config.data.tokenizer == gcs.url("conv/run")
  convert(gcs.url("conv/run"), tmp_path / "back")  # run dir on gs -> local HF
  jax.tree.map(np.testing.assert_array_equal, pretrained.load(tmp_path / "back")[1], params)
  with pytest.raises(FileExistsError, match="not empty"):
    convert(tmp_path / "hf", gcs.url("conv/run"))
  assert no_local_gs_dir(tmp_path)


def test_probe_reads_its_inputs_from_gcs_and_writes_the_report_there(gcs, tmp_path):
  import json
  from jaxencoder.probing import __main__ as probe
  tiny_bert_dir(tmp_path)
  copy_tree(tmp_path / "hf", gcs.url("probe/hf"))
  rows = "".join(f"{' '.join(WORDS[i % 7:i % 7 + 4])},{'yes' if i % 2 else 'no'}\n"
                 for i in range(30))
  as_path(gcs.url("probe/data.csv")).write_text("text,label\n" + rows)
  probe.main(["--pretrained", gcs.url("probe/hf"), "--data", gcs.url("probe/data.csv"),
              "--out", gcs.url("probe/out"), "--max-epochs", "2", "--no-control"])
  report = json.loads(as_path(gcs.url("probe/out/report.json")).read_text())
  assert report["data"]["level"] == "sentence" and "probe/out/probe_linear.png" in gcs.objects(
      "probe/out/")
  assert no_local_gs_dir(tmp_path)


def test_an_output_on_gcs_is_replaced_wholly_and_only_when_its_tool_wrote_it(gcs):
  from jaxencoder.io import outputs
  with outputs.replacing("--out", gcs.url("study"), "a-tool", overwrite=False) as local:
    (local / "old.png").write_text("earlier study")
  with pytest.raises(FileExistsError, match="pass --overwrite"):
    with outputs.replacing("--out", gcs.url("study"), "a-tool", overwrite=False):
      pass
  with outputs.replacing("--out", gcs.url("study"), "a-tool", overwrite=True) as local:
    (local / "new.png").write_text("this study")
  assert gcs.objects("study/") == ["study/" + outputs.MARKER, "study/new.png"]
  as_path(gcs.url("notes/todo.txt")).write_text("a user's")
  with pytest.raises(FileExistsError, match="was not written by a-tool"):
    with outputs.replacing("--out", gcs.url("notes"), "a-tool", overwrite=True):
      pass
  assert gcs.objects("notes/") == ["notes/todo.txt"]
  assert no_local_gs_dir()


def test_token_ids_stored_on_gcs_give_the_tokenizers_rows(gcs, tmp_path):
  from jaxencoder.data import token_ids
  from jaxencoder.data.pipeline import read_examples
  paragraphs = ["the cat sat", "a dog ran far away", "time flies like an arrow fruit banana"]
  as_path(gcs.url("raw/a.txt")).write_text("\n\n".join(paragraphs) + "\n")
  (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  out = builders.prepare("text_corpus", gcs.url("raw"), gcs.url("prepared"), name="t",
                         tokenizer=str(tmp_path / "vocab.txt"))
  assert "prepared/text_corpus/t/1.0.0/token_ids/manifest.json" in gcs.objects("prepared/")
  src, tok = sources.open_source(str(out)), Tokenizer.from_vocab(VOCAB)
  stored, _ = token_ids.stored(src, tok)
  want = token_ids.encode_rows(read_examples(src, [0, 1, 2]), tok, 5)
  for w, g in zip(want, stored.rows([0, 1, 2], 5, tok.pad_id)):
    np.testing.assert_array_equal(g, w)
  assert no_local_gs_dir()
