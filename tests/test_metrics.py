"""Run metrics (jaxencoder/train/metrics.py): device peaks, matmul FLOPs, throughput
and MFU formulas, what a run logs, and that only an enabled (process-0) writer writes."""

import types

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxencoder import Encoder, EncoderConfig
from jaxencoder.train import metrics
from jaxencoder.train.metrics import MetricWriter, read_metrics


@pytest.mark.parametrize("kind, peak", [
    ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5p", 459e12), ("TPU v6 lite", 918e12),
    ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H200", 989e12), ("cpu", None), ("NVIDIA GeForce RTX 4090", None)])
def test_device_peak_is_looked_up_by_kind(kind, peak):
  assert metrics.device_peak_flops(types.SimpleNamespace(device_kind=kind)) == peak


def test_matmul_flops_of_a_matmul_are_2mnk():
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
  assert metrics.matmul_flops(jax.jit(jnp.matmul).trace(a, b).jaxpr) == 2 * 64 * 32 * 16
  batched = jax.make_jaxpr(jnp.matmul)(jnp.ones((3, 64, 32)), jnp.ones((3, 32, 16)))
  assert metrics.matmul_flops(batched) == 3 * 2 * 64 * 32 * 16


@pytest.mark.mesh
def test_matmul_flops_count_the_whole_step_of_a_sharded_program():
  mesh = jax.make_mesh((8,), ("data",))
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
  step = jax.jit(jnp.matmul, in_shardings=(NamedSharding(mesh, P("data")),
                                           NamedSharding(mesh, P())))
  assert metrics.matmul_flops(step.trace(a, b).jaxpr) == 2 * 64 * 32 * 16
  per_shard = jax.shard_map(jnp.matmul, mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"))
  a = jax.device_put(a, NamedSharding(mesh, P("data")))
  assert metrics.matmul_flops(jax.jit(per_shard).trace(a, b).jaxpr) == 2 * 64 * 32 * 16


@pytest.mark.slow
def test_a_scanned_stack_counts_every_layer():
  """XLA's cost analysis counts a scan body once (a scanned 4-layer stack as ~1 layer);
  matmul_flops counts it `length` times: scanned == looped, forward and backward."""
  ids = jnp.ones((2, 16), jnp.int32)
  counts = {}
  for scan in (False, True):
    cfg = EncoderConfig.preset("tiny", num_layers=4, vocab_size=64, max_len=16,
                               scan_layers=scan)
    model = Encoder(cfg)
    params = model.init(jax.random.key(0), ids)
    loss = lambda p: model.apply(p, ids).last_hidden_state.sum()
    counts[scan] = metrics.matmul_flops(jax.jit(jax.grad(loss)).trace(params).jaxpr)
  assert counts[True] == counts[False] > 0


def test_throughput_and_mfu_formulas(monkeypatch):
  monkeypatch.setattr(metrics, "device_peak_flops", lambda device=None: 100e12)
  out = metrics.throughput(0.5, tokens_per_step=4096, examples_per_step=32,
                           flops_per_step=8e12, num_devices=4)
  assert out == {"step_time_s": 0.5, "tokens_per_s": 8192.0, "examples_per_s": 64.0,
                 "flops_per_step": 8e12, "achieved_flops_per_s": 16e12,
                 "mfu": pytest.approx(16e12 / (4 * 100e12))}
  monkeypatch.setattr(metrics, "device_peak_flops", lambda device=None: None)
  assert "mfu" not in metrics.throughput(0.5, 4096, 32, 8e12, 4)  # no known peak: no MFU
  assert "flops_per_step" not in metrics.throughput(0.5, 4096, 32, None, 4)


@pytest.mark.slow
def test_a_run_logs_throughput_consistent_with_its_batch(mlm_run):
  """8 rows of 16 tokens per step; achieved FLOP/s = matmul FLOPs / step time; no MFU on CPU."""
  train = [r for r in read_metrics(mlm_run.workdir) if r["split"] == "train"]
  assert [r["step"] for r in train] == [1, 2, 3]  # log_every=1: once per step, no repeats
  for record in train:
    assert record["tokens_per_s"] * record["step_time_s"] == pytest.approx(8 * 16)
    assert record["examples_per_s"] * record["step_time_s"] == pytest.approx(8)
    assert record["flops_per_step"] > 0
    assert record["achieved_flops_per_s"] == pytest.approx(
        record["flops_per_step"] / record["step_time_s"])
    assert "mfu" not in record
    assert 0.0 <= record["input_wait_fraction"] <= 1.0


def test_only_an_enabled_writer_writes(tmp_path):
  """Every process builds a MetricWriter; the loop enables only process 0's."""
  silent = MetricWriter(tmp_path / "other", enabled=False)
  silent.write(1, "train", {"loss": 1.0})
  silent.close()
  assert not (tmp_path / "other").exists()
  for step in (1, 2):  # a resumed run's writer appends
    writer = MetricWriter(tmp_path / "run")
    writer.write(step, "train", {"loss": 3.0 - step, "accuracy": jnp.float32(0.5)})
    writer.close()
  records = read_metrics(tmp_path / "run")
  assert [(r["step"], r["split"], r["loss"], r["accuracy"]) for r in records] == [
      (1, "train", 2.0, 0.5), (2, "train", 1.0, 0.5)]
  assert any((tmp_path / "run" / "tensorboard").iterdir())


@pytest.mark.parametrize("task, metric, mode", [
    ("mlm", "loss", "min"), ("electra", "generator_loss", "min"),
    ("electra", "discriminator_loss", "min"), ("mlm_sop", "pair_loss", "min"),
    ("mlm_sop", "mlm_loss", "min"), ("mlm", "dropped_predictions", "min"),
    ("classify", "accuracy", "max"), ("classify", "f1_macro", "max"),
    ("contrastive", "mrr", "max"), ("contrastive", "recall_at_1", "max"),
    ("regression", "spearman", "max"), ("electra", "replaced_recall", "max")])
def test_best_checkpoint_direction_follows_the_metric(task, metric, mode):
  """Each task's family says which of its metrics are minimised (best_metric's ranking)."""
  from jaxencoder.tasks import registry
  assert registry.family_of(task).metric_mode(metric) == mode


def test_a_train_interval_is_one_short_line_in_seconds_per_step():
  values = {"loss": 2.34567, "accuracy": 0.51234, "learning_rate": 1e-3, "step_time_s": 0.25,
            "input_wait_fraction": 0.034, "grad_norm": 1.5, "tokens_per_s": 8192.0,
            "examples_per_s": 64.0, "flops_per_step": 8e12, "achieved_flops_per_s": 16e12}
  line = metrics.train_line(200, 1000, values, "accuracy")
  assert line == ("step 200/1000: loss 2.346, accuracy 0.5123, lr 1.00e-03, 0.25 s/step, "
                  "input wait 3%, 03:20 left")  # 800 steps x 0.25 s
  fast = metrics.train_line(1000, 1000, {**values, "step_time_s": 0.004}, "loss")
  assert fast == "step 1000/1000: loss 2.346, lr 1.00e-03, 0.004 s/step, input wait 3%"
  slow = metrics.train_line(1, 10**6, {**values, "step_time_s": 123.0}, "accuracy")
  assert "123 s/step" in slow and len(slow) <= 120
