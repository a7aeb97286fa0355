"""Ahead-of-time compiles for Cloud TPU on this CPU host (libtpu's deviceless topologies):
the real TPU compiler runs, so what fits and which kernels compiled are the TPU's answer.

libtpu is in the test extra; without it these tests fail naming `pip install
'jaxencoder[tpu]'` (no skip)."""

import json
import logging
import os
import pathlib
import re
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from jaxencoder.model import flash
from jaxencoder.aot import hlo
from jaxencoder.aot.__main__ import main
from jaxencoder.aot.compile_report import compile_config
from jaxencoder.aot.targets import (GIB, UnknownTopologyError, gpu_target_config, parse_target,
                                    target_devices)
from jaxencoder.train import init_from
from jaxencoder.train.config import apply_overrides, base_config, encoder_config, finalize
from jaxencoder.train.sharding import make_mesh

SMALL = ["model.vocab_size=8192", "model.num_layers=1", "model.emb_dim=256",
         "model.num_heads=2", "model.mlp_dim=1024", "model.dtype=bfloat16",
         "model.attention_dropout_rate=0.0", "data.seq_len=128", "batch_size=32",
         "eval_batch_size=32", "mesh_shape=(1, -1, 1)", "model.attention_impl=auto"]


def small_config(*overrides):
  config = base_config()
  apply_overrides(config, SMALL + list(overrides))
  return finalize(ml_collections.ConfigDict(config.to_dict()))


@pytest.fixture(scope="module")
def v5e_report():
  """The small MLM config's train and eval steps compiled for 4 v5e chips (FSDP over 4).
  At JAX's default matmul precision: Mosaic refuses the splash kernel's bf16 products at
  the suite's 'highest' (conftest.py), as it would for a user who sets it."""
  with jax.default_matmul_precision("default"):
    return compile_config(small_config(), parse_target("v5e:2x2"))


@pytest.fixture(autouse=True)
def _keep_log_handlers():
  """main() points logging at the (captured) stderr; later tests must not write there."""
  handlers = logging.root.handlers[:]
  yield
  logging.root.handlers[:] = handlers


@pytest.mark.slow
def test_mosaic_refusing_a_kernel_is_the_compile_error(capsys):
  """What a deviceless compile is for: the TPU compiler's own verdict, in one line."""
  report = compile_config(small_config(), parse_target("v5e:2x2"), steps=("eval",))
  eval_ = report["steps"]["eval"]
  assert not eval_["compiled"] and not report["fits"]
  assert eval_["error"].startswith("INTERNAL: Mosaic failed to compile TPU kernel")
  assert report["verdict"].startswith("does not compile: eval step: INTERNAL: Mosaic")


# ---------------------------------------------------------------- targets
@pytest.mark.parametrize("name,chips,grid,hosts", [
    ("v4-8", 4, (2, 2, 1), 1), ("v4-32", 16, (2, 2, 4), 4), ("v5p-8", 4, (2, 2, 1), 1),
    ("v5p-128", 64, (4, 4, 4), 16), ("v5e-1", 1, (1, 1), 1), ("v5litepod-8", 8, (2, 4), 1),
    ("v5e-16", 16, (4, 4), 4), ("v6e-8", 8, (2, 4), 1), ("v6e-256", 256, (16, 16), 64),
    ("v5e:2x4", 8, (2, 4), 1), ("v5p:2x2x2", 8, (2, 2, 2), 2)])
def test_cloud_names_are_slices_of_chips(name, chips, grid, hosts):
  target = parse_target(name)
  assert (target.num_chips, target.grid, target.hosts) == (chips, grid, hosts)


@pytest.mark.parametrize("name,devices,processes", [
    ("v4-8", 4, 1), ("v5e-8", 8, 1), ("v5p-32", 16, 4), ("v6e-1", 1, 1)])
def test_devices_are_one_per_chip_with_the_slice_hosts(name, devices, processes):
  found = target_devices(parse_target(name))
  assert len(found) == devices  # megacore: one device per v4 / v5p chip, not per core
  assert len({d.process_index for d in found}) == processes
  assert found[0].platform == "tpu"


def test_gpu_targets_are_hosts_of_8_with_their_memory():
  target = parse_target("h200-16")
  assert (target.num_chips, target.hosts, target.topology_name) == (16, 2, "1x2x8")
  text = gpu_target_config(target.chip)
  assert "device_memory_size: 150754820096" in text and 'device_description_str: "NVIDIA H200"' in text


def test_gpu_compiles_without_the_cuda_plugin_name_the_extra():
  """This venv has no CUDA plugin (it is ~4.5 GB): one line saying what to install."""
  with pytest.raises(UnknownTopologyError, match=r"pip install 'jaxencoder\[cuda\]'"):
    target_devices(parse_target("h100"))


def test_more_slices_multiply_the_devices_and_split_the_data_axis():
  devices = target_devices(parse_target("v5e-4", slices=2))
  assert len(devices) == 8 and {d.slice_index for d in devices} == {0, 1}
  mesh = make_mesh((2, -1, 1), devices)
  for row, slice_index in zip(mesh.devices, (0, 1)):  # data axis = across slices
    assert {d.slice_index for d in row.flat} == {slice_index}


@pytest.mark.parametrize("name", ["v9-8", "v5e-3", "v4-6", "tpu", "v5e:2x2x2", "h100-12"])
def test_an_unknown_topology_names_the_accepted_forms(name):
  with pytest.raises(UnknownTopologyError, match="v5e-8.*v5e:2x4"):
    parse_target(name)


def test_the_cli_exits_2_on_an_unknown_topology(capsys):
  with pytest.raises(SystemExit) as exit_:
    main(["--config", "configs/mlm_tiny.py", "--topology", "v9-8"])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: unknown topology 'v9-8'") and "v5litepod-8" in err
  assert len(err.splitlines()) == 1


# ---------------------------------------------------------------- the attention plan
def test_auto_attention_plans_for_the_mesh_being_compiled_for_not_the_host():
  cfg = encoder_config(small_config())
  assert flash.plan_attention(cfg) == flash.AttentionPlan("xla")  # this host: CPU
  tpu_mesh = make_mesh((1, -1, 1), target_devices(parse_target("v5e:2x2")))
  with jax.sharding.use_abstract_mesh(tpu_mesh.abstract_mesh):
    assert flash.plan_attention(cfg) == flash.AttentionPlan("splash", interpret=False)
  splash = encoder_config(small_config("model.attention_impl=splash"))
  assert flash.plan_attention(splash) == flash.AttentionPlan("splash", interpret=True)


# ---------------------------------------------------------------- compiled for v5e
@pytest.mark.slow
def test_splash_compiles_natively_for_tpu_and_the_hlo_holds_its_kernels(v5e_report):
  train, eval_ = v5e_report["steps"]["train"], v5e_report["steps"]["eval"]
  assert train["compiled"] and eval_["compiled"] and v5e_report["fits"]
  assert hlo.splash_calls(eval_["kernels"]) == {"fwd": 1}  # one layer, forward only
  train_calls = hlo.splash_calls(train["kernels"])
  assert train_calls.get("dq") == 1 and train_calls.get("dkv") == 1 and train_calls["fwd"] >= 1
  attention = v5e_report["attention"]
  assert (attention["impl"], attention["layers_on_kernel"]) == ("splash", 1)


@pytest.mark.slow
def test_fsdp_gives_each_chip_a_quarter_of_the_params(v5e_report):
  """The eval step's arguments per chip (the compiler's count) are the params plus this
  chip's rows of the batch: a quarter of the param tree's bytes under FSDP over 4 chips,
  all of them when the 4 chips are data parallel."""
  param_bytes = v5e_report["params"] * 4  # float32 params
  batch_bytes = 32 * 128 * 4 * 7 / 4  # 7 [B, L] arrays of 4 bytes, this chip's rows
  fsdp = v5e_report["steps"]["eval"]["memory_per_chip"]["argument_bytes"] - batch_bytes
  with jax.default_matmul_precision("default"):
    data_parallel = compile_config(small_config("mesh_shape=(-1, 1, 1)"),
                                   parse_target("v5e:2x2"), steps=("eval",))
  replicated = data_parallel["steps"]["eval"]["memory_per_chip"]["argument_bytes"] - batch_bytes
  # within 3%: vocab-sized biases have no fsdp axis, and TPU tiles pad small arrays
  assert fsdp == pytest.approx(param_bytes / 4, rel=0.03)
  assert replicated == pytest.approx(param_bytes, rel=0.03)
  # the train state: params and Adam's two moments, each split the same way
  assert v5e_report["state_bytes_per_chip"] == pytest.approx(3 * param_bytes / 4, rel=0.03)


@pytest.mark.slow
def test_flops_are_the_whole_steps_matmuls(v5e_report):
  train, eval_ = v5e_report["steps"]["train"], v5e_report["steps"]["eval"]
  # backward ~2x forward: a train step costs about 3x an eval step of the same batch
  assert 2.5 < train["flops"] / eval_["flops"] < 3.5
  assert train["flops_per_chip"] == pytest.approx(train["flops"] / 4)


@pytest.mark.slow
def test_the_fsdp_step_gathers_params_and_reduces_gradients(v5e_report):
  collectives = v5e_report["steps"]["train"]["collectives"]
  assert collectives["all-gather"]["count"] > 0 and collectives["all-gather"]["bytes"] > 0
  reduced = collectives["all-reduce"]["bytes"] + collectives["reduce-scatter"]["bytes"]
  assert reduced > 0


@pytest.mark.slow
def test_a_batch_too_large_for_the_chip_exits_1_with_one_line(capsys):
  """A 4M-token vocabulary replicated on every chip: params and Adam alone are 12 GiB."""
  overrides = [f"--config.{o}" for o in SMALL if not o.startswith(("model.vocab", "mesh"))]
  with pytest.raises(SystemExit) as exit_, jax.default_matmul_precision("default"):
    main(["--config", "configs/mlm_tiny.py", "--topology", "v5e-4", "--steps", "train", "--json",
          *overrides, "--config.model.vocab_size=4194304", "--config.mesh_shape=(-1, 1, 1)"])
  assert exit_.value.code == 1
  out, err = capsys.readouterr()
  report = json.loads(out)
  assert not report["fits"] and report["steps"]["train"]["out_of_memory"]
  line = err.strip().splitlines()[-1]
  assert re.fullmatch(r"does not fit: [\d.]+ GiB per chip of 16 GiB \(v5e\); largest batch "
                      r"that fits: none \(train step at batch 32\)", line), line
  assert float(line.split()[3]) > 16
  assert report["max_batch"] == 0  # searched on a miss: not even 4 rows (one a chip) fit


# ---------------------------------------------------------------- the kernel per step
MODERN = ["model.num_layers=4", "model.emb_dim=256", "model.num_heads=2",
          "model.mlp_dim=512", "model.position_embedding=rope", "model.rope_base=160000.0",
          "model.local_rope_base=10000.0", "model.global_attention_every=3",
          "model.sliding_window=64", "model.activation=geglu", "model.norm_position=pre",
          "model.first_attention_norm=False", "model.use_bias=False", "model.norm_bias=False",
          "model.type_vocab_size=0", "model.scan_layers=True", "model.remat_policy=save_dots",
          "model.family=modernbert", "data.seq_len=256", "max_predictions=-1",
          "data.mask_rate=0.3"]


@pytest.mark.slow
def test_every_layer_of_the_scanned_mixed_stack_runs_splash_in_the_train_step():
  """A scanned global/local stack (one period of 3 layers scanned, layer 3 unrolled, the
  sparse MLM last block) compiled for v5e: the train step's backward holds one splash dq
  call per layer, so no layer computed dense [L, L] scores; the eval step as well."""
  with jax.default_matmul_precision("default"):
    report = compile_config(small_config(*MODERN), parse_target("v5e:2x2"))
  for name in ("train", "eval"):
    attention = report["steps"][name]["attention"]
    assert (attention["impl"], attention["layers_on_kernel"], attention["fallbacks"]) == (
        "splash", 4, []), (name, attention)


@pytest.mark.slow
def test_the_report_names_the_step_a_kernel_misses_and_the_key_to_change(capsys):
  """Attention dropout keeps splash out of the train step only: the eval step's count
  must not hide it, and the line names model.attention_dropout_rate."""
  with jax.default_matmul_precision("default"):
    main(["--config", "configs/mlm_tiny.py", "--topology", "v5e:2x2", "--steps", "train,eval",
          *(f"--config.{o}" for o in SMALL), "--config.model.attention_dropout_rate=0.1",
          "--config.model.num_layers=2"])  # fits: returns, no SystemExit
  out = capsys.readouterr().out
  assert "attention, train step: xla in 0 of 2 layers" in out
  assert "attention, eval step: splash in 2 of 2 layers" in out
  assert ("layers 0-1 run xla: splash cannot serve them (attention dropout is on (the kernel "
          "has none: set model.attention_dropout_rate=0))") in " ".join(out.split())  # wrapped at 100


# ---------------------------------------------------------------- the HLO reader
LOOP_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%gather_body (p: bf16[4,8]) -> bf16[16,8] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %all-gather.1 = bf16[16,8]{1,0} all-gather(%p), replica_groups={}, dimensions={0}
}

%body (t: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %t = (s32[], bf16[4,8]{1,0}) parameter(0)
  %x = bf16[4,8]{1,0} get-tuple-element(%t), index=1
  %f = bf16[16,8]{1,0} fusion(%x), kind=kCustom, calls=%gather_body
  %k = f32[16,8]{1,0} custom-call(%f), custom_call_target="tpu_custom_call"
  ROOT %out = (s32[], bf16[4,8]{1,0}) tuple(%i, %x)
}

%cond (t: (s32[], bf16[4,8])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: bf16[4,8]) -> f32[] {
  %a = bf16[4,8]{1,0} parameter(0)
  %w = (s32[], bf16[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %r = f32[8]{0} all-reduce(%v), replica_groups={}, to_apply=%add
  ROOT %s = f32[] constant(0)
}
"""


def test_a_loop_bodys_collectives_count_once_per_iteration():
  ops = hlo.step_ops(LOOP_HLO)
  assert ops.collectives["all-gather"] == {"count": 12, "bytes": 12 * 16 * 8 * 2}
  assert ops.collectives["all-reduce"] == {"count": 1, "bytes": 8 * 4}
  assert ops.kernels == {"k": 12} and ops.unknown_trip_counts == 0


def test_shape_bytes_reads_tuples_and_layouts():
  assert hlo.shape_bytes("bf16[128,768]{1,0:T(8,128)(2,1)}") == 128 * 768 * 2
  assert hlo.shape_bytes("(f32[4]{0}, s8[2,2]{1,0}, pred[])") == 16 + 4 + 1


@pytest.mark.slow
def test_bert_base_as_shipped_fits_a_v5e_8_with_splash_in_every_layer():
  """configs/mlm_bert_base.py, unchanged, on 8 v5e chips (the README's TPU claim)."""
  from jaxencoder.train.config_file import load_config
  config = finalize(ml_collections.ConfigDict(load_config("configs/mlm_bert_base.py").to_dict()))
  with jax.default_matmul_precision("default"):
    report = compile_config(config, parse_target("v5e-8"))
  assert report["fits"], report["verdict"]
  assert report["attention"]["impl"] == "splash"
  assert report["attention"]["layers_on_kernel"] == 12
  peak = max(s["memory_per_chip"]["total_bytes"] for s in report["steps"].values())
  assert 0 < peak < 16 * GIB
  assert np.isclose(report["params"], 110e6, rtol=0.02)


# mlm_bert_base has its own test above.
CONFIGS = sorted(p.stem for p in pathlib.Path("configs").glob("*.py") if p.stem != "mlm_bert_base")


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_compiles_for_a_v5e_slice_and_fits(name, tmp_path_factory):
  """Each configs/*.py as shipped (init_from's architecture included), both steps, on 8
  v5e chips, or on one where its batches do not split over 8 (the CPU-sized ones: eval
  batches of 50 and 500; the tool refuses them on 8, as train.py would)."""
  from jaxencoder.train.config_file import load_config
  config = load_config(f"configs/{name}.py")
  config.data.data_dir = str(tmp_path_factory.mktemp("data"))  # init_from converts here
  config = init_from.finalized(config)
  splits = config.batch_size % 8 == 0 and config.eval_batch_size % 8 == 0
  with jax.default_matmul_precision("default"):
    report = compile_config(config, parse_target("v5e-8" if splits else "v5e-1"))
  assert report["fits"], report["verdict"]


@pytest.mark.slow
def test_the_cli_prints_no_libtpu_chatter_on_a_host_without_chips(tmp_path):
  """A user's run: no JAX_PLATFORMS, libtpu installed, no TPU: only the report."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "TPU_", "XLA_"))}
  env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
  done = subprocess.run(
      [sys.executable, "-m", "jaxencoder.aot", "--config", "configs/mlm_tiny.py", "--topology",
       "v5e-4", "--steps", "eval", "--config.model.num_layers=1"],
      capture_output=True, text=True, env=env, timeout=600)
  assert done.returncode == 0, done.stderr
  noise = [l for l in done.stderr.splitlines() if "TPU_" in l or "InitGoogle" in l or
           "libtpu" in l.lower() or l.startswith(("E0000", "W0000", "==="))]
  assert noise == []
  assert "running on cpu: 1 device" in done.stderr  # the host that compiles, said first
  assert done.stdout.strip().splitlines()[-1].startswith("fits: ")


@pytest.mark.parametrize("per_row, start", [(1.0e6, 64), (3.3e7, 256), (2.0e9, 8)])
def test_the_largest_batch_search_lands_within_a_64th_of_the_limit(monkeypatch, per_row, start):
  """Memory = state + per_row x batch (the compiler's answer, scripted): the search ends
  on a batch that fits, within 1/64 (or one mesh unit) of the true limit, in few compiles."""
  from jaxencoder.aot import compiled
  hbm, state, unit = 16 * GIB, 3 * GIB, 8
  needed = lambda b: state + per_row * b
  def fake_compile(built, name, batch, group=None):
    fits = needed(batch) <= hbm
    return compiled.StepReport(name, batch, fits, 0.0, "" if fits else "RESOURCE_EXHAUSTED",
                               not fits, memory={"total_bytes": needed(batch)})
  monkeypatch.setattr(compiled, "compile_step", fake_compile)
  monkeypatch.setattr(compiled, "batch_unit", lambda built: unit)
  built = type("Built", (), {"state_bytes_per_chip": state})()
  largest, tried = compiled.largest_batch(built, hbm, fake_compile(built, "train", start))
  limit = int((hbm - state) / per_row) // unit * unit
  assert largest <= limit and limit - largest <= max(unit, limit // 64)
  assert len(tried) <= 5


def wide_result() -> dict:
  """A report as compile_config returns it, with the long values a big model has."""
  def step(batch):
    return {"compiled": True, "batch_size": batch, "compile_seconds": 151.2, "fits": True,
            "error": None, "out_of_memory": False,
            "memory_per_chip": {"argument_bytes": 3.1 * GIB, "output_bytes": 3.0 * GIB,
                                "alias_bytes": 3.0 * GIB, "temp_bytes": 7.9 * GIB,
                                "total_bytes": 11.2 * GIB},
            "flops": 1.2e15, "flops_per_chip": 1.5e14,
            "collectives": {k: {"count": 123, "bytes": 1.5 * GIB} for k in hlo.COLLECTIVES},
            "kernels": {f"tpu_custom_call_splash_mha_fwd_residuals_{i}": 12 for i in range(6)},
            "attention": {"impl": "xla", "layers_on_kernel": 0, "num_layers": 12,
                          "fallbacks": [{"layers": "0-11", "kernel": "splash",
                                         "reason": "attention dropout is on (the kernel has "
                                                   "none: set model.attention_dropout_rate=0)"}]}}
  return {"config": "configs/mlm_bert_base.py", "topology": "v5e-8",
          "target": {"chip": "v5e", "platform": "tpu", "chips": 8, "hosts": 1, "slices": 1,
                     "topology_name": "v5e:2x4", "hbm_bytes_per_chip": 16 * GIB,
                     "device_kind": "TPU v5 lite"},
          "mesh": {"data": 1, "fsdp": 8, "tensor": 1}, "params": 110e6, "seq_len": 512,
          "task": "mlm", "dtype": "bfloat16", "scan_layers": True, "remat_policy": "full",
          "attention_impl": "auto", "steps": {"train": step(256), "eval": step(256)},
          "verdict": "fits: 11.20 GiB per chip of 16 GiB (v5e)", "seconds": 474.0}


def test_the_report_table_fits_100_columns_and_points_at_json_for_the_rest():
  from jaxencoder.aot.compile_report import format_report
  lines = format_report(wide_result()).splitlines()
  assert max(map(len, lines)) <= 100, max(lines, key=len)
  assert any(line.startswith("compiled ") and "yes, 151.2 s" in line for line in lines)
  assert any(line.startswith("kernels ") and line.endswith("...") for line in lines)
  assert any("--json" in line for line in lines)


def test_each_compiled_step_says_when_it_starts_and_how_long_it_took(monkeypatch, caplog):
  from jaxencoder.aot import compile_report
  from jaxencoder.aot import compiled as compiled_lib
  monkeypatch.setattr(compiled_lib, "build", lambda *args, **kwargs: None)
  monkeypatch.setattr(compiled_lib, "compile_step", lambda built, name, batch, group=None:
                      compiled_lib.StepReport(name, batch, False, 151.2, "refused"))
  with caplog.at_level(logging.INFO, logger="jaxencoder"), pytest.raises(AttributeError):
    # the lines around each compile are checked; the report of no build cannot follow
    compile_report._compile_config(small_config(), parse_target("v5e-8"), [], ["train"],
                                   False, None, 0.0)
  assert [r.getMessage() for r in caplog.records] == [
      "compiling the train step for v5e-8 (batch 32)...",
      "failed to compile the train step for v5e-8 in 2 min 31 s"]


def test_durations_read_in_minutes_past_one():
  from jaxencoder.aot.compile_report import duration
  assert [duration(s) for s in (12.34, 59.9, 151.2, 474.0)] == [
      "12.3 s", "59.9 s", "2 min 31 s", "7 min 54 s"]
