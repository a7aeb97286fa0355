"""The training loop end to end on tiny data: tasks, resume, meshes, faults, configs."""

import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import time

import itertools

import jax
import ml_collections
import numpy as np
import pytest

import train_helpers as th
from jaxencoder.train import sharding
from jaxencoder.train import steps
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import ENCODER
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained.convert import restore_for_export
from jaxencoder.train.loop import NonFiniteLossError, build_task, setup, train_and_evaluate
from jaxencoder.train.optim import make_optimizer
from jaxencoder.train.stop import EXIT_PREEMPTED
from jaxencoder.train.datasets import make_pipelines
from jaxencoder.train.metrics import read_metrics
from jaxencoder.train.init_from import adopt
from jaxencoder.train.config import (apply_overrides, base_config, encoder_config,
                                     finalize, model_config, override_model)

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


train_losses, final_params = th.train_losses, th.final_params


@pytest.mark.slow
def test_mlm_loss_falls_on_a_memorisation_task(corpus, tmp_path):
  root, _, vocab = corpus
  source = th.text_corpus(tmp_path, docs=200, distinct=3, name="three")  # 3 sentences
  config = th.tiny_config(root, source, vocab, dropout_rate=0.0, attention_dropout_rate=0.0)
  config.num_train_steps, config.log_every, config.eval_every = 80, 1, 80
  config.checkpoint_every, config.optim.learning_rate = 80, 1e-2
  metrics = train_and_evaluate(config, tmp_path)
  losses = train_losses(tmp_path)
  assert losses[0] > 3.0  # ~log(vocab) at init
  assert np.mean(losses[-10:]) < 0.5 * losses[0]
  assert metrics["loss"] < losses[0]
  records = read_metrics(tmp_path)
  assert {"tokens_per_s", "step_time_s", "learning_rate", "grad_norm"} <= set(records[0])
  assert (tmp_path / "tensorboard").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classify", "token_classify", "image", "series", "contrastive"])
def test_each_task_trains_a_few_steps(corpus, tmp_path, kind):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps = 3
  if kind == "classify":
    config.task, config.data.kind = "classify", "text_classification"
    config.data.source, config.data.eval_split = th.classification_set(tmp_path), "test"
  elif kind == "token_classify":
    config.task, config.data.kind = "token_classify", "tagged_tokens"
    config.data.source = th.tagged_set(tmp_path)
  elif kind == "image":
    config.task, config.data.kind = "classify", "image_arrays"
    config.data.source, config.data.eval_split = th.image_set(tmp_path), "test"
    config.model = th.model_config(encoder_config(config).replace(
        input_kind="image", image_size=(8, 8), patch_size=4, num_channels=1))
  elif kind == "series":
    config.task, config.data.kind = "classify", "time_series"
    config.data.source, config.data.eval_split = th.series_set(tmp_path), "test"
    config.model = th.model_config(encoder_config(config).replace(
        input_kind="series", input_features=1))
  else:
    config.task = "contrastive"
  metrics = train_and_evaluate(config, tmp_path / "run")
  assert np.isfinite(metrics["loss"]) and 0.0 <= metrics["accuracy"] <= 1.0
  if kind in ("classify", "token_classify"):
    assert 0.0 <= metrics["f1_macro"] <= 1.0
  assert Checkpointer(tmp_path / "run" / "checkpoints", save_interval_steps=1,
                      max_to_keep=None).latest_step() == 3


@pytest.mark.slow
def test_rerun_resumes_and_matches_an_uninterrupted_run(corpus, tmp_path):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.optim.total_steps = 8, 8  # same schedule when stopped early
  train_and_evaluate(config, tmp_path / "straight")
  config.num_train_steps = 3
  train_and_evaluate(config, tmp_path / "resumed")
  config.num_train_steps = 8
  train_and_evaluate(config, tmp_path / "resumed")  # continues from step 3
  steps_logged = [r["step"] for r in read_metrics(tmp_path / "resumed") if r["split"] == "train"]
  assert steps_logged == list(range(1, 9))
  np.testing.assert_array_equal(train_losses(tmp_path / "resumed"),
                                train_losses(tmp_path / "straight"))
  a, b = (final_params(config, tmp_path / d) for d in ("straight", "resumed"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["pack", "best_fit"])
def test_a_run_with_data_workers_resumes_to_the_params_of_a_run_without(corpus, tmp_path,
                                                                         packing):
  """2 grain worker processes, stopped at step 3 and resumed: the same batches, losses and
  params as 8 steps made in the trainer's process (packed: the stateful path)."""
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.optim.total_steps = 8, 8
  config.data.packing = packing
  config.data.workers = 0
  train_and_evaluate(config, tmp_path / "straight")
  config.data.workers = 2
  config.num_train_steps = 3
  train_and_evaluate(config, tmp_path / "workers")
  config.num_train_steps = 8
  train_and_evaluate(config, tmp_path / "workers")
  np.testing.assert_array_equal(train_losses(tmp_path / "workers"),
                                train_losses(tmp_path / "straight"))
  a, b = (final_params(config, tmp_path / d) for d in ("straight", "workers"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
@pytest.mark.mesh
def test_losses_equal_across_meshes_on_8_devices(corpus):
  """The default config's task and optimizer on 1 device and on 8 as data/fsdp/tensor/mixed."""
  root, source, vocab = corpus
  config = finalize(th.tiny_config(root, source, vocab))
  pipelines = make_pipelines(config)
  batches = list(itertools.islice(iter(pipelines.train), 5))
  task = build_task(config, pipelines)
  losses = {}
  for shape in [(1, 1, 1), (8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2)]:
    mesh = sharding.make_mesh(shape, jax.devices()[:int(np.prod(shape))])
    rules = sharding.rules_from_config(config.logical_axis_rules)
    tx, _ = make_optimizer(config.optim, steps.param_shapes(task, batches[0]),
                           num_layers=config.model.num_layers)
    state = steps.init_state(task, tx, batches[0], jax.random.key(0), mesh, rules)
    shardings = steps.state_shardings(task, tx, batches[0], mesh, rules)
    step = steps.jit_train_step(task, tx, jax.random.key(1), shardings, mesh)
    losses[shape] = []
    with steps.mesh_context(mesh, rules):
      for batch in batches:
        state, metrics = step(state, sharding.put_batch(batch, mesh))
        losses[shape].append(float(metrics["loss"]))
  for shape, values in losses.items():
    np.testing.assert_allclose(values, losses[(1, 1, 1)], atol=1e-5, err_msg=str(shape))
  assert len(set(np.round(losses[(1, 1, 1)], 4))) > 1  # the runs really trained


@pytest.mark.slow
@pytest.mark.mesh
def test_checkpoint_restores_onto_another_mesh(corpus, tmp_path):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.optim.total_steps = 6
  config.num_train_steps, config.mesh_shape = 3, (1, 8, 1)
  train_and_evaluate(config, tmp_path / "run")
  config.num_train_steps, config.mesh_shape = 6, (4, 2, 1)
  train_and_evaluate(config, tmp_path / "run")  # resumes the fsdp checkpoint on 4x2
  config.mesh_shape = (1, 8, 1)
  train_and_evaluate(config, tmp_path / "straight")
  np.testing.assert_allclose(train_losses(tmp_path / "run"),
                             train_losses(tmp_path / "straight"), atol=1e-5)


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_saves_no_nan(corpus, tmp_path):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.checkpoint_every, config.eval_every = 8, 1, 8
  config.optim.learning_rate, config.optim.grad_clip_norm = 1e30, 0.0
  config.optim.warmup_steps = 0
  with pytest.raises(NonFiniteLossError, match=r"NaN/Inf at step \d+"):
    train_and_evaluate(config, tmp_path)
  config.optim.learning_rate = 1e-3
  run = setup(finalize(config), tmp_path)
  leaves = jax.tree.leaves(jax.device_get(run.state.params))
  run.checkpointer.close()
  assert all(np.all(np.isfinite(x)) for x in leaves)


@pytest.mark.slow
def test_init_from_loads_the_encoder_into_a_new_head(corpus, mlm_run, tmp_path):
  root, source, vocab = corpus
  mlm_encoder = final_params(mlm_run.config, mlm_run.workdir)["encoder"]
  cls = th.tiny_config(root, source, vocab)
  cls.task, cls.data.kind = "classify", "text_classification"
  cls.data.source, cls.data.eval_split = th.classification_set(tmp_path), "test"
  cls.init_from = str(mlm_run.workdir)
  cls.optim.freeze_encoder = True
  cls.num_train_steps = 3
  train_and_evaluate(cls, tmp_path / "cls")
  after = final_params(cls, tmp_path / "cls")
  jax.tree.map(np.testing.assert_array_equal, after["encoder"], mlm_encoder)
  assert "head" in after


def test_init_from_takes_the_stored_architecture_and_overrides_win(corpus, mlm_run, tmp_path):
  root, source, vocab = corpus
  # A config for another architecture: init_from brings the stored one (3 layers, 32 wide).
  other = th.tiny_config(root, source, vocab, emb_dim=48, num_layers=1, dropout_rate=0.3)
  other.init_from = str(mlm_run.workdir)
  changes = adopt(other)
  assert "model.emb_dim: 48 -> 32" in changes and "model.num_layers: 1 -> 3" in changes
  assert other.model.dropout_rate == 0.3  # how to run it stays this config's
  # An explicit model override wins, and a shape that cannot load names param and shapes.
  wide = th.tiny_config(root, source, vocab, num_layers=3)
  apply_overrides(wide, [f"init_from={mlm_run.workdir}", "model.emb_dim=48"])
  assert tuple(wide.model_overrides) == ("emb_dim",)
  # The Python twin of the flag behaves the same; a plain assignment is a preset, replaced.
  from_python = th.tiny_config(root, source, vocab, num_layers=3)
  from_python.init_from = str(mlm_run.workdir)
  override_model(from_python, emb_dim=48)
  assigned = th.tiny_config(root, source, vocab, num_layers=3)
  assigned.init_from, assigned.model.emb_dim = str(mlm_run.workdir), 48
  assert adopt(from_python) == adopt(ml_collections.ConfigDict(wide.to_dict()))
  assert from_python.model.emb_dim == 48 and "model.emb_dim: 48 -> 32" in adopt(assigned)
  with pytest.raises(KeyError, match="unknown model field 'emb_size'"):
    override_model(from_python, emb_size=48)
  with pytest.raises(ValueError, match=r"(?s)init_from=.*embeddings/token_embed/embedding: "
                                       r"checkpoint \(\d+, 32\) vs model \(\d+, 48\)"):
    train_and_evaluate(wide, tmp_path / "wide")


def test_init_from_a_missing_directory_names_it(corpus, tmp_path):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.init_from = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match=r"nowhere: no checkpoint here"):
    train_and_evaluate(config, tmp_path / "run")


@pytest.mark.slow
def test_unknown_override_lists_valid_keys():
  config = base_config()
  with pytest.raises(KeyError, match=r"unknown config key 'optim.lr'.*optim.learning_rate"):
    apply_overrides(config, ["optim.lr=1"])
  apply_overrides(config, ["optim.learning_rate=0.5", "model.num_layers=3", "data.packing=pack",
                           "mesh_shape=(2, -1, 1)", "progress_bar=false"])
  assert config.optim.learning_rate == 0.5 and config.model.num_layers == 3
  assert tuple(config.mesh_shape) == (2, -1, 1) and config.progress_bar is False
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--config",
                           str(REPO / "configs/mlm_tiny.py"), "--workdir", "/tmp/unused",
                           "--config.batchsize=3"], capture_output=True, text=True)
  assert result.returncode != 0 and "unknown config key 'batchsize'" in result.stderr


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.py")), ids=lambda p: p.stem)
def test_every_config_builds(path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = finalize(module.get_config())
  assert module.__doc__ and "train.py --config" in module.__doc__.replace("make train", "train.py --config")
  cfg = encoder_config(config)
  assert cfg.num_layers >= 1 and config.optim.total_steps == config.num_train_steps


SUBPROCESS_RUN = """
import sys
sys.path.insert(0, {tests!r})
import train_helpers as th, pathlib
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.stop import EXIT_PREEMPTED, Preempted
root = pathlib.Path({root!r})
config = th.tiny_config(root, {source!r}, pathlib.Path({vocab!r}))
config.num_train_steps, config.checkpoint_every, config.eval_every = {steps}, 5, 1000
config.log_every = 1
try:
  train_and_evaluate(config, {workdir!r})
except Preempted as e:
  print(e)
  sys.exit(EXIT_PREEMPTED)
"""


def _start(corpus, workdir, steps_total):
  root, source, vocab = corpus
  code = SUBPROCESS_RUN.format(tests=str(REPO / "tests"), root=str(root), source=source,
                               vocab=str(vocab), steps=steps_total, workdir=str(workdir))
  return subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_for_checkpoint(workdir, step, proc, timeout=240):
  deadline = time.time() + timeout
  while not (workdir / "checkpoints" / str(step)).is_dir():
    if proc.poll() is not None:
      raise AssertionError(f"run ended early:\n{proc.stdout.read().decode()[-3000:]}")
    if time.time() > deadline:
      proc.kill()
      raise AssertionError("no checkpoint in time")
    time.sleep(0.05)


@pytest.mark.slow
def test_kill_minus_9_loses_only_steps_since_the_last_save(corpus, tmp_path):
  steps_total = 60
  proc = _start(corpus, tmp_path / "killed", steps_total)
  try:
    _wait_for_checkpoint(tmp_path / "killed", 10, proc)
    proc.kill()  # SIGKILL mid-run
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL
  killed_at = Checkpointer(tmp_path / "killed" / "checkpoints", save_interval_steps=1,
                           max_to_keep=None).latest_step()
  assert 10 <= killed_at < steps_total  # killed mid-run
  for workdir in ("killed", "straight"):  # resume the killed run; run one straight through
    run = _start(corpus, tmp_path / workdir, steps_total)
    assert run.wait(timeout=600) == 0, run.stdout.read().decode()[-3000:]
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps = steps_total
  a, b = (final_params(config, tmp_path / d) for d in ("killed", "straight"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_sigterm_saves_before_exit(corpus, tmp_path):
  proc = _start(corpus, tmp_path, 10_000)
  try:
    _wait_for_checkpoint(tmp_path, 5, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_PREEMPTED
  finally:
    if proc.poll() is None:
      proc.kill()
  saved = Checkpointer(tmp_path / "checkpoints", save_interval_steps=1, max_to_keep=None)
  last_logged = max(r["step"] for r in read_metrics(tmp_path) if r["split"] == "train")
  assert saved.latest_step() == last_logged >= 5  # saved where it stopped


@pytest.mark.slow
def test_pmap_mode_matches_jit_and_shares_checkpoints(corpus, tmp_path):
  root, source, vocab = corpus
  def config(parallelism, total):
    c = th.tiny_config(root, source, vocab, dropout_rate=0.0, attention_dropout_rate=0.0)
    c.parallelism, c.num_train_steps, c.optim.total_steps = parallelism, total, 6
    return c
  train_and_evaluate(config("jit", 6), tmp_path / "jit")
  train_and_evaluate(config("pmap", 3), tmp_path / "pmap")
  train_and_evaluate(config("jit", 6), tmp_path / "pmap")  # pmap checkpoint -> jit path
  np.testing.assert_allclose(train_losses(tmp_path / "pmap"), train_losses(tmp_path / "jit"),
                             atol=1e-5)
  train_and_evaluate(config("jit", 3), tmp_path / "back")
  train_and_evaluate(config("pmap", 6), tmp_path / "back")  # jit checkpoint -> pmap
  np.testing.assert_allclose(train_losses(tmp_path / "back"), train_losses(tmp_path / "jit"),
                             atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("best_metric, scripted, kept", [
    ("loss", {3: 1.0, 6: 2.0, 9: 3.0}, [3, 9]),  # lower is better
    ("accuracy", {3: 0.2, 6: 0.9, 9: 0.1}, [6, 9]),  # higher is better
    ("generator_loss", {3: 2.0, 6: 1.0, 9: 3.0}, [6, 9]),  # any *_loss: lower (was kept max)
])
def test_keeps_the_latest_and_the_best_checkpoint_by_eval_metric(
    corpus, tmp_path, monkeypatch, best_metric, scripted, kept):
  """keep_checkpoints=1 with evals at steps 3, 6, 9 (scripted values): the latest step and
  the best one by `best_metric` stay on disk."""
  from jaxencoder.train import loop
  def scripted_eval(run, eval_step, signals=None):
    value = scripted[int(run.state.step)]
    return {"loss": value, "accuracy": value, best_metric: value}
  monkeypatch.setattr(loop, "evaluate", scripted_eval)
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.eval_every, config.checkpoint_every = 9, 3, 3
  config.keep_checkpoints, config.best_metric, config.log_every = 1, best_metric, 9
  train_and_evaluate(config, tmp_path)
  saved = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert saved == kept


@pytest.mark.slow
def test_test_split_is_scored_with_the_checkpoint_best_on_the_eval_split(tmp_path, monkeypatch):
  """Eval (scripted) at steps 3, 6, 9 peaks at 6: data.test_split is then evaluated, for
  real, with step 6's restored params, and reported as test_* metrics at step 6."""
  from jaxencoder.train import loop
  real_evaluate, tested = loop.evaluate, []
  def evaluate(run, eval_step, signals=None, *, make_batches=None):
    if make_batches is None:
      return {"loss": 1.0, "accuracy": {3: 0.2, 6: 0.9, 9: 0.1}[int(run.state.step)]}
    tested.append((int(run.state.step), jax.device_get(run.state.params[ENCODER])))
    return real_evaluate(run, eval_step, signals, make_batches=make_batches)
  monkeypatch.setattr(loop, "evaluate", evaluate)
  config = base_config()
  config.task, config.num_classes, config.best_metric = "classify", 2, "accuracy"
  config.model = model_config(EncoderConfig(
      input_kind="series", input_features=1, type_vocab_size=0, num_layers=1, emb_dim=16,
      num_heads=2, mlp_dim=32, max_len=16))
  config.data.kind, config.data.seq_len = "time_series", 12
  config.data.source, config.data.data_dir = th.series_set(tmp_path), str(tmp_path)
  config.data.holdout_every, config.data.test_split = 4, "test"  # eval: 6 of the 24 train
  config.batch_size, config.eval_batch_size, config.progress_bar = 8, 8, False
  config.num_train_steps, config.eval_every, config.checkpoint_every = 9, 3, 3
  config.keep_checkpoints, config.log_every = 1, 9
  metrics = train_and_evaluate(config, tmp_path / "run")
  (step, params), = tested
  assert step == 6
  _, saved = restore_for_export(RunDir(tmp_path / "run"), step=6)
  jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(saved))
  assert metrics["accuracy"] == 0.1 and 0 <= metrics["test_accuracy"] <= 1
  rows = [r for r in read_metrics(tmp_path / "run") if r["split"] == "test"]
  assert [r["step"] for r in rows] == [6]
  assert rows[0]["accuracy"] == metrics["test_accuracy"]
