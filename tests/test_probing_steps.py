"""Probing across checkpoints (`jaxencoder-probe --steps`) and keeping them (keep_every_steps)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder import Encoder
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.probing import dynamics, features
from test_probing_cli import tagged_dataset

STEPS = (0, 5, 10)


def encoder_params(cfg, seed: int):
  ids = np.ones((1, 8), np.int32)
  return nn.meta.unbox(jax.jit(Encoder(cfg).init)(jax.random.key(seed), ids)["params"])


def write_run(workdir, cfg, steps, vocab_path):
  """A train.py-style workdir whose checkpoints hold different params at each step."""
  with Checkpointer(workdir / "checkpoints", save_interval_steps=1, max_to_keep=None) as ckpt:
    for seed, step in enumerate(steps):
      ckpt.save(step, {"params": {"encoder": encoder_params(cfg, seed)}}, force=True,
                config={"model": cfg.to_dict(), "data": {"tokenizer": str(vocab_path)}})
    ckpt.wait()
  return workdir


def write_tagged(path, dataset: features.Dataset):
  path.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                            for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n")
  return path


def probe_steps(tmp_path, steps, which: str):
  """Runs the CLI with --steps `which` on a run holding `steps`; (report, out dir)."""
  from jaxencoder.probing import __main__ as probe
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  run = write_run(tmp_path / "run", cfg, steps, vocab)
  data = write_tagged(tmp_path / "tags.txt", tagged_dataset([4 + i % 16 for i in range(30)]))
  out = tmp_path / "out"
  rep = probe.main(["--checkpoint", str(run), "--data", str(data), "--out", str(out),
                    "--max-epochs", "2", "--batch-size", "8", "--steps", which])
  return rep, out


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
  return probe_steps(tmp_path_factory.mktemp("steps"), STEPS, "all")


@pytest.mark.slow  # the fast suite checks the newest of three steps the same way
def test_probing_the_only_step_equals_the_single_checkpoint_report(tmp_path):
  rep, out = probe_steps(tmp_path, (3,), "all")
  linear = rep["probes"]["linear"]
  assert linear["steps"] == [{"step": 3, "layers": linear["layers"]}]
  assert "selectivity" in linear["layers"][0]  # word level: the control task too
  saved = json.loads((out / "report.json").read_text())["probes"]["linear"]
  assert saved["steps"] == json.loads(json.dumps(linear["steps"]))


def test_every_kept_step_is_probed_in_step_order_and_the_steps_differ(three_steps):
  rep, _ = three_steps
  entries = rep["probes"]["linear"]["steps"]
  assert [e["step"] for e in entries] == list(STEPS)
  num_layers = len(rep["probes"]["linear"]["layers"])
  assert all(len(e["layers"]) == num_layers for e in entries)
  assert set(entries[0]["layers"][0]) == set(rep["probes"]["linear"]["layers"][0])
  layers = [e["layers"] for e in entries]
  assert layers[0] != layers[1] != layers[2] != layers[0]
  assert entries[-1]["layers"] == rep["probes"]["linear"]["layers"]  # the newest step


def test_one_compiled_extractor_serves_every_step(three_steps):
  rep, _ = three_steps
  assert rep["steps_study"]["steps"] == list(STEPS)
  assert rep["steps_study"]["compiles"] == rep["data"]["compiles"] == 2  # buckets 16, 32


def test_the_heatmap_and_the_curves_are_written_and_listed(three_steps):
  rep, out = three_steps
  for name in ("probe_steps_heatmap", "probe_steps_curves"):
    png = out / f"{name}.png"
    assert png.read_bytes()[:4] == b"\x89PNG", name
    assert str(png) in rep["plots"]


def test_an_extractor_passed_to_extract_traces_once_per_bucket_for_any_params():
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  tok, dataset = tiny_tokenizer(), tagged_dataset([3, 20, 7, 25])  # buckets 16 and 32
  extractor = features.Extractor(cfg, encoder_params(cfg, 0))
  feats = [features.extract(cfg, encoder_params(cfg, seed), tok, dataset, batch_size=2,
                            max_length=64, progress=False, extractor=extractor)
           for seed in (0, 1)]
  assert extractor.traces == feats[-1].info["compiles"] == 2
  fresh = features.extract(cfg, encoder_params(cfg, 1), tok, dataset, batch_size=2,
                           max_length=64, progress=False)
  np.testing.assert_array_equal(feats[-1].layers[-1], fresh.layers[-1])
  assert not np.allclose(feats[0].layers[-1], feats[-1].layers[-1])


def test_steps_are_all_or_a_comma_list_of_kept_steps():
  assert dynamics.parse_steps("all", [10, 0, 5]) == [0, 5, 10]
  assert dynamics.parse_steps("10, 0", [0, 5, 10]) == [0, 10]
  with pytest.raises(ValueError, match=r"step \[7\]; kept steps: \[0, 5, 10\]"):
    dynamics.parse_steps("5,7", [0, 5, 10])
  with pytest.raises(ValueError, match=r"kept steps: \[0, 5, 10\]"):
    dynamics.parse_steps("last", [0, 5, 10])


def test_a_step_that_was_not_kept_fails_before_the_study(tmp_path, monkeypatch, capsys):
  from jaxencoder.probing import __main__ as probe
  from jaxencoder.probing import study
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  run = write_run(tmp_path / "run", cfg, (0, 5), vocab)
  monkeypatch.setattr(study, "run", lambda *a, **k: pytest.fail("the study ran"))
  with pytest.raises(SystemExit) as exited:
    probe.main(["--checkpoint", str(run), "--data", str(tmp_path / "any.txt"), "--out",
                str(tmp_path / "out"), "--steps", "5,7"])
  assert exited.value.code == 2
  assert "step [7]; kept steps: [0, 5]" in capsys.readouterr().err


def test_keep_every_keeps_the_multiples_besides_the_latest(tmp_path):
  state = {"w": np.zeros(3, np.float32)}
  with Checkpointer(tmp_path, save_interval_steps=2, max_to_keep=1, keep_every=4,
                    async_save=False) as ckpt:
    for step in range(2, 11, 2):
      ckpt.save(step, state)
    ckpt.wait()
    assert ckpt.all_steps() == [4, 8, 10]


def test_keep_every_steps_must_be_a_multiple_of_checkpoint_every():
  from jaxencoder.train.config import base_config, finalize
  config = base_config()
  config.checkpoint_every, config.keep_every_steps = 50, 75
  with pytest.raises(ValueError, match="multiple of checkpoint_every=50"):
    finalize(config)


@pytest.mark.slow
def test_a_run_with_keep_every_steps_keeps_those_steps_and_the_latest(tmp_path):
  import train_helpers as th
  from jaxencoder.train.loop import train_and_evaluate
  config = th.tiny_config(tmp_path, th.text_corpus(tmp_path), th.write_vocab(tmp_path))
  config.num_train_steps, config.checkpoint_every, config.eval_every = 10, 2, 10
  config.keep_checkpoints, config.keep_every_steps = 1, 4
  train_and_evaluate(config, tmp_path / "run")
  saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                 if p.name.isdigit())
  assert saved == [4, 8, 10]
