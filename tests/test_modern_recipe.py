"""The modern encoder recipe end to end on CPU: configs/modernbert_base.py:cpu (ModernBERT's
layer pattern scanned by period, best-fit packed rows, WSD, 30% masking) trains through
train.py, and a run killed with SIGKILL resumes to exactly the metrics of one that was
not."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from jaxencoder.train.config_file import load_config

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS = 20
ARGS = ["--config", "configs/modernbert_base.py:cpu", f"--config.num_train_steps={STEPS}",
        "--config.checkpoint_every=5", f"--config.eval_every={STEPS}", "--config.log_every=1",
        "--config.progress_bar=false", "--config.data.workers=0"]


def test_the_cpu_variant_keeps_the_recipe_at_a_cpu_size():
  big, cpu = load_config("configs/modernbert_base.py"), load_config("configs/modernbert_base.py:cpu")
  for key in ("global_attention_every", "scan_layers", "position_embedding", "activation",
              "attention_dropout_rate", "first_attention_norm"):
    assert cpu.model[key] == big.model[key], key
  assert (cpu.data.packing, cpu.data.mask_rate, cpu.optim.schedule) == ("best_fit", 0.3, "wsd")
  assert (big.model.num_layers, big.model.emb_dim, big.model.mlp_dim) == (22, 768, 1152)
  assert cpu.model.num_layers == 4 and cpu.model.emb_dim == 64  # a period of 3 and layer 3
  long = load_config("configs/modernbert_base_long.py")
  assert (long.data.seq_len, long.model_overrides) == (8192, ("rope_base",))


def train(workdir: pathlib.Path) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "train.py", *ARGS, "--workdir", str(workdir)],
                          cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def metrics(workdir: pathlib.Path) -> list[tuple]:
  """Every train and eval row's values, in order, less those that time the run."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  timed = ("time", "per_s", "wait", "seconds")
  return [{k: v for k, v in r.items() if not any(t in k for t in timed)} for r in rows
          if r.get("split") in ("train", "eval")]


@pytest.mark.slow
def test_the_cpu_recipe_killed_and_resumed_gives_the_metrics_of_a_straight_run(tmp_path):
  straight = train(tmp_path / "straight")
  out = straight.communicate(timeout=1200)[0].decode()
  assert straight.returncode == 0, out[-3000:]
  assert "packing: best_fit, efficiency" in out, out[-3000:]
  killed = train(tmp_path / "killed")
  try:
    while not (tmp_path / "killed" / "checkpoints" / "10").is_dir():
      assert killed.poll() is None, killed.stdout.read().decode()[-3000:]
      time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
  finally:
    if killed.poll() is None:
      killed.kill()
  resumed = train(tmp_path / "killed")
  out = resumed.communicate(timeout=1200)[0].decode()
  assert resumed.returncode == 0 and "resumed from step" in out, out[-3000:]
  a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "killed")
  assert [r["step"] for r in a if r["split"] == "train"] == list(range(1, STEPS + 1))
  assert a == b
