"""The tools that read a run (export, convert, probe) skip a damaged newest checkpoint as
train and predict do: one warning naming the damaged step and the step used; a damaged
step asked for by number, or no step that restores, is one error line."""

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from data_helpers import WORDS
from jaxencoder import pretrained
from jaxencoder.export import __main__ as export_cli
from jaxencoder.io.checkpoint import ParamsMismatch
from jaxencoder.io.run_dir import RunDir, UnrestorableStep
from jaxencoder.pretrained import __main__ as convert_cli
from jaxencoder.probing import __main__ as probe_cli
from jaxencoder.probing.load import load_checkpoint
from jaxencoder.model.restore_targets import (encoder_params, restore_encoder, stored_config,
                                        stored_encoder)
from test_faults import DAMAGE

REPO = pathlib.Path(__file__).resolve().parents[1]

# In another process: tensorstore caches what this process writes, so a read here could
# come from that cache rather than from the damaged files.
WRITE_RUN = """
import sys
sys.path.insert(0, {tests!r})
import pathlib, jax, numpy as np, flax.linen as nn
from conftest import tiny_config
from data_helpers import VOCAB
from jaxencoder.model.heads import EncoderForMaskedLM
from jaxencoder.io.checkpoint import Checkpointer
run = pathlib.Path({run!r})
run.mkdir(parents=True)
(run / "vocab.txt").write_text("\\n".join(VOCAB) + "\\n")  # the run's own tokenizer copy
cfg = tiny_config(vocab_size=len(VOCAB))
with Checkpointer(run / "checkpoints", save_interval_steps=1, max_to_keep=None) as ckpt:
  for step in (2, 4):  # other weights at each step
    init = EncoderForMaskedLM(cfg).init(jax.random.key(step), np.ones((1, 8), np.int32))
    ckpt.save(step, {{"params": nn.meta.unbox(init["params"])}}, force=True,
              config={{"model": cfg.to_dict(), "data": {{"seq_len": 16}}}})
    ckpt.wait()
"""


@pytest.fixture(scope="module")
def intact_run(tmp_path_factory):
  """A run with steps 2 and 4 (an encoder and an MLM head each); read it, never damage it."""
  run = tmp_path_factory.mktemp("intact") / "run"
  code = WRITE_RUN.format(tests=str(REPO / "tests"), run=str(run))
  written = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300)
  assert written.returncode == 0, written.stderr[-3000:]
  return run


@pytest.fixture(scope="module")
def step_2_encoder(intact_run):
  return jax.device_get(stored_encoder(RunDir.open(intact_run), step=2))


def damaged_copy(intact_run, tmp_path, damage="truncated array file", steps=(4,)):
  run = tmp_path / "run"
  shutil.copytree(intact_run, run)
  for step in steps:
    DAMAGE[damage](run / "checkpoints" / str(step))
  return run


def fallback_warnings(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]


def assert_one_warning_naming_steps_4_and_2(caplog, run):
  warning, = fallback_warnings(caplog)
  assert warning.startswith(f"{run / 'checkpoints' / '4'} cannot be restored (")
  assert warning.endswith("); using step 2")


def assert_trees_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def tagged_data(tmp_path) -> pathlib.Path:
  data = tmp_path / "tags.txt"
  data.write_text("".join(" ".join(f"{w}/{'DET' if i % 3 else 'NOUN'}"
                                   for i, w in enumerate(WORDS[k % 9:k % 9 + 5])) + "\n"
                          for k in range(40)))
  return data


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_convert_falls_back_past_a_damaged_newest_step(intact_run, step_2_encoder, tmp_path,
                                                       caplog, capsys, damage):
  run = damaged_copy(intact_run, tmp_path, damage)
  convert_cli.main(["--from", str(run), "--to", str(tmp_path / "hf")])  # exit 0: no SystemExit
  assert "wrote Hugging Face BERT directory" in capsys.readouterr().out
  assert_one_warning_naming_steps_4_and_2(caplog, run)
  assert_trees_equal(pretrained.load(tmp_path / "hf")[1]["encoder"], step_2_encoder)


def test_export_falls_back_past_a_damaged_newest_step(intact_run, tmp_path, caplog, capsys):
  run = damaged_copy(intact_run, tmp_path)
  export_cli.main(["--run", str(run), "--out", str(tmp_path / "exported"), "--no-check"])
  assert "wrote" in capsys.readouterr().out
  assert_one_warning_naming_steps_4_and_2(caplog, run)
  spec = json.loads((tmp_path / "exported" / "export.json").read_text())
  assert spec["source"]["step"] == 2


def test_probe_falls_back_past_a_damaged_newest_step(intact_run, step_2_encoder, tmp_path,
                                                     caplog, capsys):
  run = damaged_copy(intact_run, tmp_path)
  probe_cli.main(["--checkpoint", str(run), "--data", str(tagged_data(tmp_path)),
                  "--out", str(tmp_path / "probe"), "--max-epochs", "1", "--no-control"])
  assert f"wrote {tmp_path / 'probe' / 'report.json'}" in capsys.readouterr().out
  assert_one_warning_naming_steps_4_and_2(caplog, run)
  caplog.clear()
  assert_trees_equal(jax.device_get(load_checkpoint(run)[1]), step_2_encoder)
  assert_one_warning_naming_steps_4_and_2(caplog, run)


def test_a_damaged_step_asked_for_by_number_is_an_error_naming_it(intact_run, tmp_path, caplog):
  run = damaged_copy(intact_run, tmp_path)
  with pytest.raises(UnrestorableStep) as raised:
    stored_encoder(RunDir.open(run), step=4)
  assert str(raised.value).startswith(f"{run / 'checkpoints' / '4'} cannot be restored (")
  assert str(raised.value).endswith("); choose another step (saved: 2, 4)")
  assert "\n" not in str(raised.value) and not fallback_warnings(caplog)  # no silent fallback


def test_no_step_that_restores_is_one_error_line_and_nothing_written(intact_run, tmp_path,
                                                                     capsys):
  run = damaged_copy(intact_run, tmp_path, steps=(2, 4))
  with pytest.raises(SystemExit) as exit_info:
    convert_cli.main(["--from", str(run), "--to", str(tmp_path / "hf")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert "\n" not in err
  assert err.startswith(f"error: no restorable checkpoint in {run / 'checkpoints'}: step 4: ")
  assert "; step 2: " in err and err.endswith("; restore the checkpoints from a copy, or retrain")
  assert not (tmp_path / "hf").exists()
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "4"]  # kept


def test_a_target_of_another_shape_raises_naming_the_param_not_a_fallback(intact_run, tmp_path,
                                                                          caplog):
  run = RunDir.open(damaged_copy(intact_run, tmp_path))
  narrow = encoder_params(stored_config(run, 2).replace(emb_dim=16))
  with pytest.raises(ParamsMismatch, match=r"params/encoder/embeddings/token_embed/embedding: "
                                           r"checkpoint \(32, 32\) vs model \(32, 16\)"):
    restore_encoder(run, narrow)
  assert not fallback_warnings(caplog)
