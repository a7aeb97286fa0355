"""Two processes x 4 CPU devices (jax.distributed, gloo) against one process x 8 devices."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import train_helpers as th
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]

WORKER = """
import sys
sys.path.insert(0, {tests!r})
import pathlib
from jaxencoder.train import distributed
distributed.initialize({address!r}, 2, {pid})
import train_helpers as th
from jaxencoder.train.loop import train_and_evaluate
config = th.tiny_config(pathlib.Path({root!r}), {source!r}, pathlib.Path({vocab!r}),
                        dropout_rate=0.0, attention_dropout_rate=0.0)
config.num_train_steps, config.optim.total_steps = {steps}, 6
config.checkpoint_every, config.eval_every, config.mesh_shape = 2, 100, (2, 4, 1)
train_and_evaluate(config, {workdir!r})
"""

pytestmark = [pytest.mark.mesh, pytest.mark.slow]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(corpus, workdir, steps):
  """Starts the two worker processes (4 virtual CPU devices each)."""
  root, source, vocab = corpus
  address = f"127.0.0.1:{_free_port()}"
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
         "JAX_PLATFORMS": "cpu"}
  return [subprocess.Popen(
      [sys.executable, "-c", WORKER.format(tests=str(REPO / "tests"), address=address, pid=pid,
                                           root=str(root), source=source, vocab=str(vocab),
                                           steps=steps, workdir=str(workdir))],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for pid in range(2)]


def _run_two_processes(corpus, workdir, steps, timeout=300):
  procs = _launch(corpus, workdir, steps)
  try:
    for proc in procs:
      out, _ = proc.communicate(timeout=timeout)
      assert proc.returncode == 0, out.decode()[-3000:]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()


def _single_process_config(corpus, steps):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab, dropout_rate=0.0, attention_dropout_rate=0.0)
  config.num_train_steps, config.optim.total_steps = steps, 6
  config.checkpoint_every, config.eval_every, config.mesh_shape = 2, 100, (2, 4, 1)
  return config


def _losses(workdir):
  return [r["loss"] for r in read_metrics(workdir) if r["split"] == "train"]


def test_two_processes_match_one_process_and_checkpoints_cross_over(corpus, tmp_path):
  train_and_evaluate(_single_process_config(corpus, 6), tmp_path / "single")
  reference = _losses(tmp_path / "single")

  _run_two_processes(corpus, tmp_path / "multi", steps=4)
  records = read_metrics(tmp_path / "multi")  # process 0 alone writes metrics: no repeats
  assert [r["step"] for r in records if r["split"] == "train"] == [1, 2, 3, 4]
  assert [r["step"] for r in records if r["split"] == "eval"] == [4]
  train_and_evaluate(_single_process_config(corpus, 6), tmp_path / "multi")  # 2 -> 1 process
  np.testing.assert_allclose(_losses(tmp_path / "multi"), reference, atol=1e-5)

  train_and_evaluate(_single_process_config(corpus, 2), tmp_path / "back")
  _run_two_processes(corpus, tmp_path / "back", steps=6)  # 1 -> 2 processes
  np.testing.assert_allclose(_losses(tmp_path / "back"), reference, atol=1e-5)


def test_a_dying_process_makes_the_other_fail_fast(corpus, tmp_path):
  procs = _launch(corpus, tmp_path, steps=100_000)
  try:
    deadline = time.time() + 240
    while not (tmp_path / "checkpoints" / "2").is_dir():
      assert time.time() < deadline and procs[0].poll() is None, "no checkpoint in time"
      time.sleep(0.1)
    procs[1].send_signal(signal.SIGKILL)
    start = time.time()
    out, _ = procs[0].communicate(timeout=120)
    assert procs[0].returncode != 0
    assert time.time() - start < 90
    # The coordination service reports the dead peer; when the kill lands mid-collective,
    # the CPU collectives (Gloo) may report it first
    # (not its start-up lines: a read that failed because the peer is gone).
    died = (b"stopped sending heartbeats", b"another task died", b"Connection closed by peer",
            b"Connection reset by peer", b"Received data size doesn't match expected size")
    assert any(message in out for message in died), out[-2000:]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
