"""Issue 42, item 5: a step out of device memory is one line naming the step, its batch
and about the largest batch that fits (from the compiled step's memory analysis), exit 1;
an eval that fails saves the step it evaluates first, so a resume continues from it."""

import pathlib
import re
import types

import jax
import numpy as np
import pytest

import train_helpers as th
from jaxencoder.io.run_dir import RunDir
from jaxencoder.train import __main__ as train_main
from jaxencoder.train import out_of_memory as oom
from jaxencoder.train import parallel, steps
from jaxencoder.train.config import base_config
from jaxencoder.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30
ALLOCATION = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 25769803776 bytes."
TPU_COMPILE = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
               "memory space hbm. Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.\n\n"
               "Total hbm usage >= 22.47G:\n    reserved        530.00M\n    program    21.95G")


# The estimate.

@pytest.mark.parametrize("limit,unit,largest", [
    (6, 1, 32),  # 64 rows take 8 GiB beyond the fixed 2: 4 GiB of room hold 32
    (5, 1, 24), (5, 16, 16), (6, 8, 32),
    (1.5, 1, 0),  # the state alone does not fit
])
def test_the_largest_batch_scales_the_bytes_that_grow_with_it_to_the_limit(limit, unit, largest):
  footprint = oom.Footprint(needed=10 * GIB, fixed=2 * GIB, limit=limit * GIB)
  assert oom.largest_batch(64, footprint, unit) == largest


@pytest.mark.parametrize("footprint", [
    oom.Footprint(needed=10 * GIB, fixed=2 * GIB, limit=None),  # CPU: no limit
    oom.Footprint(needed=None, fixed=2 * GIB, limit=8 * GIB),  # no memory analysis
    oom.Footprint(needed=2 * GIB, fixed=2 * GIB, limit=8 * GIB)])  # nothing grows
def test_no_estimate_where_it_cannot_be_told(footprint):
  assert oom.largest_batch(64, footprint) is None


def memory_analysis(**sizes):
  fields = dict(argument_size_in_bytes=0, output_size_in_bytes=0, alias_size_in_bytes=0,
                temp_size_in_bytes=0, generated_code_size_in_bytes=0)
  fields.update(sizes)
  return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(**fields))


def test_the_bytes_needed_count_donated_outputs_once():
  compiled = memory_analysis(argument_size_in_bytes=100, output_size_in_bytes=60,
                             alias_size_in_bytes=50, temp_size_in_bytes=300,
                             generated_code_size_in_bytes=7)
  assert oom.needed_bytes(compiled) == 100 + 60 - 50 + 300 + 7
  assert oom.needed_bytes(None) is None


def test_a_compilers_stated_bytes_are_read():
  assert oom.stated_bytes(TPU_COMPILE) == (22.47 * GIB, 15.48 * GIB)
  assert oom.stated_bytes(ALLOCATION) == (None, None)


def test_out_of_memory_is_xlas_resource_exhausted_not_a_full_disk():
  assert oom.is_out_of_memory(jax.errors.JaxRuntimeError(ALLOCATION))
  assert oom.is_out_of_memory(jax.errors.JaxRuntimeError(TPU_COMPILE))
  assert not oom.is_out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: a kernel failed"))
  assert not oom.is_out_of_memory(ValueError(ALLOCATION))  # not from XLA
  full_disk = 'RESOURCE_EXHAUSTED: Error writing "w/0.0" at "/r/ckpt/2": No space left on device'
  assert not oom.is_out_of_memory(jax.errors.JaxRuntimeError(full_disk))


def state_of(mib: int):
  """A replicated array of `mib` MiB: the fixed bytes a device holds."""
  return jax.device_put(np.zeros((mib, 1 << 18), np.float32), jax.devices()[0])


def test_the_line_names_step_batch_and_the_estimate(monkeypatch):
  config = base_config()
  config.batch_size, config.data.seq_len, config.mesh_shape = 64, 128, (1, -1, 1)
  monkeypatch.setattr(oom, "device_limit", lambda: 6 * GIB)
  compiled = memory_analysis(argument_size_in_bytes=2 * GIB, temp_size_in_bytes=8 * GIB)
  line = oom.describe("train", jax.errors.JaxRuntimeError(ALLOCATION), config,
                      state_of(2048), lambda: compiled)
  unit = jax.device_count()  # 64 * (6 - 2) / (10 - 2) = 32 rows, in whole device steps
  assert line == (
      "out of device memory in the train step at batch 64 x 128 (about 10 GiB a device of 6 "
      f"GiB); the largest batch_size that fits is about {32 // unit * unit} (estimate from "
      "the memory analysis; `jaxencoder-compile --topology TARGET --max_batch` searches it "
      "exactly): lower batch_size (now 64) and raise optim.grad_accum_steps (now 1) to keep "
      "the rows a step, or lower data.seq_len (now 128)")


def test_a_tpu_compile_error_is_estimated_from_its_own_figures():
  config = base_config()
  config.eval_batch_size, config.data.seq_len = 512, 128
  line = oom.describe("eval", jax.errors.JaxRuntimeError(TPU_COMPILE), config, state_of(512),
                      lambda: None)
  rows = int(512 * (15.48 - 0.5) / (22.47 - 0.5)) // jax.device_count() * jax.device_count()
  assert line == ("out of device memory in the eval step at batch 512 x 128 (about 22.5 GiB a "
                  f"device of 15.5 GiB); the largest eval_batch_size that fits is about {rows} "
                  "(estimate from the memory analysis): lower eval_batch_size (now 512)")


def test_without_a_device_limit_the_line_says_what_to_lower(monkeypatch):
  config = base_config()
  config.batch_size, config.data.seq_len, config.optim.grad_accum_steps = 64, 128, 4
  compiled = memory_analysis(argument_size_in_bytes=GIB, temp_size_in_bytes=GIB)
  line = oom.describe("train", jax.errors.JaxRuntimeError(ALLOCATION), config, state_of(1),
                      lambda: compiled)
  assert oom.device_limit() is None  # the CPU backend reports none
  assert line == ("out of device memory in the train step at batch 64 x 128 (x 4 micro-batches "
                  "a step) (about 2 GiB a device); this backend reports no memory limit to "
                  "estimate the largest batch_size that fits from: lower batch_size (now 64) "
                  "and raise optim.grad_accum_steps (now 4) to keep the rows a step, or lower "
                  "data.seq_len (now 128)")


# train.py, in process: the step raises a real-looking RESOURCE_EXHAUSTED.

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return th.corpus_overrides(tmp_path_factory.mktemp("data"))


TINY = {"data.seq_len": 16, "model.num_layers": 1, "model.emb_dim": 32, "model.num_heads": 4,
        "model.mlp_dim": 64, "model.max_len": 32, "batch_size": 16, "eval_batch_size": 8,
        "progress_bar": "false", "num_train_steps": 6, "log_every": 1, "eval_every": 3,
        "checkpoint_every": 2, "optim.warmup_steps": 1, "optim.total_steps": 6}


def train(workdir, capsys, **overrides) -> tuple[int, list[str]]:
  """train.py's main in this process: (exit code, stderr lines but the log's)."""
  flags = [f"--config.{k}={v}" for k, v in {**TINY, **overrides}.items()]
  code = 0
  try:
    train_main.main(["--config", str(REPO / "configs/mlm_tiny.py"), "--workdir", str(workdir),
                     *flags])
  except SystemExit as e:
    code = e.code
  err = capsys.readouterr().err.splitlines()
  return code, [l for l in err if not re.search(r" (INFO|WARNING) ", l)]


def split_steps(workdir, split: str) -> list[int]:
  return [r["step"] for r in read_metrics(workdir) if r["split"] == split]


def test_a_train_step_out_of_memory_is_one_line_naming_the_estimate(tmp_path, corpus, capsys,
                                                                    monkeypatch):
  """The 5th step raises; the limit set so that 3/4 of the batch's bytes fit: batch 16
  over 8 devices -> about 8 (12 rows, in whole steps of 8)."""
  real, seen = parallel.JitStepper.step, []
  def step(self, batch):
    seen.append(1)
    if len(seen) == 5:
      needed, fixed = oom.needed_bytes(self.compiled), oom.per_device_bytes(self.state)
      monkeypatch.setattr(oom, "device_limit", lambda: fixed + 0.75 * (needed - fixed))
      raise jax.errors.JaxRuntimeError(ALLOCATION)
    return real(self, batch)
  monkeypatch.setattr(parallel.JitStepper, "step", step)
  monkeypatch.delenv("JAXENCODER_TRACEBACK", raising=False)
  code, lines = train(tmp_path / "run", capsys, **corpus)
  assert code == 1 and len(lines) == 1, lines
  checkpoints = tmp_path / "run" / "checkpoints"
  assert re.fullmatch(
      r"error: out of device memory in the train step at batch 16 x 16 \(about [\d.]+ MiB a "
      r"device of [\d.]+ MiB\); the largest batch_size that fits is about 8 \(estimate from "
      r"the memory analysis; `jaxencoder-compile --topology TARGET --max_batch` searches it "
      r"exactly\): lower batch_size \(now 16\) and raise optim.grad_accum_steps \(now 1\) to "
      r"keep the rows a step, or lower data.seq_len \(now 16\); step 4 in "
      + re.escape(str(checkpoints)) + r" is the last durable one", lines[0]), lines[0]
  assert RunDir.open(tmp_path / "run").steps() == [2, 4]


def test_a_train_step_that_does_not_compile_in_memory_is_estimated_from_the_compiler(
    tmp_path, corpus, capsys, monkeypatch):
  """XLA:TPU refuses the program at compile time, stating its bytes and the chip's."""
  def refuse(*args):
    raise jax.errors.JaxRuntimeError(TPU_COMPILE)
  monkeypatch.setattr(parallel, "compile_timed", refuse)
  monkeypatch.delenv("JAXENCODER_TRACEBACK", raising=False)
  code, lines = train(tmp_path / "run", capsys, **corpus)
  assert code == 1 and len(lines) == 1, lines
  match = re.fullmatch(
      r"error: out of device memory in the train step at batch 16 x 16 \(about 22.5 GiB a "
      r"device of 15.5 GiB\); the largest batch_size that fits is about (\d+) \(estimate .*"
      r"searches it exactly\): lower batch_size \(now 16\) .*; no step was saved", lines[0])
  assert match and int(match[1]) == int(16 * 15.48 / 22.47) // 8 * 8, lines[0]  # tiny state
  assert not (tmp_path / "run" / "checkpoints").exists() or not any(
      (tmp_path / "run" / "checkpoints").iterdir())


def failing_eval(monkeypatch, at: int):
  """jit_eval_step whose `at`-th eval (a whole split) raises out of memory at its first
  batch; its lower() is the real step's (the line's memory analysis)."""
  real, evals = steps.jit_eval_step, []
  def jit_eval_step(*args, **kwargs):
    jitted = real(*args, **kwargs)
    def call(params, batch):
      if not evals or evals[-1] is not params:  # a new eval: new params
        evals.append(params)
      if len(evals) == at:
        raise jax.errors.JaxRuntimeError(ALLOCATION)
      return jitted(params, batch)
    call.lower = jitted.lower
    return call
  monkeypatch.setattr(steps, "jit_eval_step", jit_eval_step)


def eval_line(workdir: pathlib.Path, step: int) -> str:
  return ("error: out of device memory in the eval step at batch 8 x 16 (about MIB a device); "
          "this backend reports no memory limit to estimate the largest eval_batch_size that "
          f"fits from: lower eval_batch_size (now 8); step {step} is saved in "
          f"{workdir / 'checkpoints'}: rerun with the same --workdir to continue from it")


def test_an_eval_out_of_memory_saves_its_step_first(tmp_path, corpus, capsys, monkeypatch):
  """The eval at step 3 fails, the last save was at step 2: step 3 is saved all the same."""
  failing_eval(monkeypatch, at=1)
  monkeypatch.delenv("JAXENCODER_TRACEBACK", raising=False)
  code, lines = train(tmp_path / "run", capsys, **corpus)
  assert code == 1 and len(lines) == 1, lines
  assert re.sub(r"about [\d.]+ MiB", "about MIB", lines[0]) == eval_line(tmp_path / "run", 3)
  assert RunDir.open(tmp_path / "run").steps() == [2, 3]
  assert split_steps(tmp_path / "run", "train") == [1, 2, 3]
  assert split_steps(tmp_path / "run", "eval") == []


@pytest.mark.slow
def test_a_resume_after_a_failed_eval_matches_an_uninterrupted_run(tmp_path, corpus, capsys,
                                                                   monkeypatch):
  """Step 3 saved by its failing eval; the rerun continues from it to the same losses and
  final eval as a run that never failed (step 3's eval stays missing: it never ran)."""
  assert train(tmp_path / "straight", capsys, **corpus)[0] == 0
  with monkeypatch.context() as patched:
    failing_eval(patched, at=1)
    assert train(tmp_path / "resumed", capsys, **corpus)[0] == 1
  assert train(tmp_path / "resumed", capsys, **corpus)[0] == 0
  assert split_steps(tmp_path / "resumed", "train") == [1, 2, 3, 4, 5, 6]
  assert split_steps(tmp_path / "resumed", "eval") == [6]
  np.testing.assert_array_equal(th.train_losses(tmp_path / "resumed"),
                                th.train_losses(tmp_path / "straight"))
  final = [[r["loss"] for r in read_metrics(tmp_path / d) if r["split"] == "eval"][-1]
           for d in ("straight", "resumed")]
  assert final[0] == final[1]
