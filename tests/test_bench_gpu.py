"""bench/gpu_bench.py, the same-run GPU benchmark, rehearsed on CPU with --tiny.

The jax contenders run for real (a 2-layer, 128-wide model, L = 32, B = 4); the torch
ones only where torch and transformers are installed (make parity-deps).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_bench  # noqa: E402
import train_step  # noqa: E402

PEAK = 989e12


def run_bench(out_dir, *flags, env=None, timeout=300):
  """Runs the tiny orchestration on CPU; (its records, its report, its stdout)."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", str(out_dir / "jax_cache"))
  cmd = [sys.executable, os.path.join(REPO, "bench", "gpu_bench.py"), "--tiny",
         "--attention", "xla", "--shapes", "32x4", "--out", str(out_dir), "--cache-dir", cache,
         *flags]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})
  assert proc.returncode == 0, proc.stdout + proc.stderr
  records = [json.loads(line) for line in (out_dir / gpu_bench.RESULTS).read_text().splitlines()]
  return records, (out_dir / gpu_bench.REPORT).read_text(), proc.stdout


def contender_records(records):
  return {r["contender"]: r for r in records if r["record"] == "contender"}


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
  return run_bench(tmp_path_factory.mktemp("jax_run"), "--contenders", "jaxencoder,jaxencoder_full")


@pytest.mark.slow  # contender processes
def test_each_jax_contender_appends_one_measured_line(jax_run):
  records, _, _ = jax_run
  assert [r["record"] for r in records] == ["run", "contender", "contender"]
  for name, r in contender_records(records).items():
    assert r["status"] == "ok", r
    assert (r["seq"], r["batch"], r["preset"]) == (32, 4, "tiny")
    assert r["tokens_per_s"] > 0 and r["setup_s"] > 0 and r["first_step_s"] > 0
    assert len(r["step_s_all"]) == 2 and r["compile_cache"] in ("hit", "miss")
    assert r["rng_impl"] == "rbg" and r["attention"] == "xla"
    assert 0 < r["loss_last"] < 20  # about ln(30522) = 10.3 after two steps


@pytest.mark.slow  # contender processes
def test_mfu_uses_train_flops_for_both_counts(jax_run):
  rows = contender_records(jax_run[0])
  full_flops = train_step.train_flops("tiny", 4, 32, 32)
  sparse_flops = train_step.train_flops("tiny", 4, 32, train_step.num_predictions(32))
  assert sparse_flops < full_flops
  for name, own in (("jaxencoder_full", full_flops), ("jaxencoder", sparse_flops)):
    r = rows[name]
    assert r["flops"] == own and r["flops_bert"] == full_flops
    assert r["mfu"] == pytest.approx(own / r["step_s"] / PEAK)
    assert r["mfu_bert"] == pytest.approx(full_flops / r["step_s"] / PEAK)
    assert r["tokens_per_s"] == pytest.approx(4 * 32 / r["step_s"])


@pytest.mark.slow  # contender processes
def test_report_has_a_row_per_contender_and_is_rebuilt_from_the_lines(jax_run, tmp_path):
  records, report, stdout = jax_run
  rows = [line for line in report.splitlines() if line.startswith("| 32 x 4 |")]
  assert [row.split(" | ")[1] for row in rows] == ["jaxencoder_full", "jaxencoder"]
  assert all(" | ok | " in row for row in rows) and report in stdout
  (tmp_path / gpu_bench.RESULTS).write_text("".join(json.dumps(r) + "\n" for r in records))
  rebuilt = subprocess.run([sys.executable, os.path.join(REPO, "bench", "gpu_bench.py"),
                            "--report", str(tmp_path)], capture_output=True, text=True)
  assert rebuilt.returncode == 0, rebuilt.stderr
  assert rebuilt.stdout == report == (tmp_path / gpu_bench.REPORT).read_text()


@pytest.mark.slow  # contender processes
def test_a_failing_contender_is_recorded_and_the_next_one_still_runs(tmp_path):
  records, report, _ = run_bench(tmp_path, "--contenders", "jaxencoder,jaxencoder_full",
                                 "--attention", "no_such_impl")
  rows = contender_records(records)
  assert set(rows) == {"jaxencoder", "jaxencoder_full"}
  for r in rows.values():
    assert r["status"] == "failed" and "attention_impl" in r["error"], r
  assert report.count("| failed |") == 2


@pytest.mark.slow  # contender processes
def test_a_contender_past_its_timeout_is_killed_and_recorded(tmp_path):
  records, report, _ = run_bench(tmp_path, "--contenders", "jaxencoder", "--timeout", "0.5",
                                 "--min-start", "0")
  (r,) = contender_records(records).values()
  assert r["status"] == "timeout" and r["wall_s"] < 30
  assert "| timeout |" in report


@pytest.mark.slow
def test_no_contender_starts_past_the_deadline_but_the_table_is_written(tmp_path):
  records, report, _ = run_bench(tmp_path, "--deadline", "0")
  statuses = [r["status"] for r in records if r["record"] == "contender"]
  assert statuses == ["skipped"] * 4
  assert report.count("| skipped |") == 4


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
  """Eager torch, and torch.compile with no working C++ compiler (so it fails on CPU)."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  out = tmp_path_factory.mktemp("torch_run")
  env = {"CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor")}
  return run_bench(out, "--contenders", "torch_compile,torch", env=env)


@pytest.mark.slow  # contender processes
def test_torch_contender_runs_on_cpu(torch_run):
  r = contender_records(torch_run[0])["torch"]
  assert r["status"] == "ok", r
  assert r["attention"] == "sdpa" and r["tokens_per_s"] > 0
  assert r["mfu"] == r["mfu_bert"] == pytest.approx(
      train_step.train_flops("tiny", 4, 32, 32) / r["step_s"] / PEAK)


@pytest.mark.slow  # contender processes
def test_a_failing_torch_compile_is_recorded_with_its_exception(torch_run):
  records, report, _ = torch_run
  r = contender_records(records)["torch_compile"]
  assert r["status"] == "failed" and "Compiler" in r["error"], r
  assert "| torch_compile | failed |" in report


def test_plan_runs_the_anchor_and_the_sparse_step_at_every_shape_first():
  args = gpu_bench.parse_args(["--shapes", "128x256,512x64"])
  assert gpu_bench.plan(args)[:4] == [("torch_compile", 128, 256), ("jaxencoder", 128, 256),
                                      ("torch_compile", 512, 64), ("jaxencoder", 512, 64)]
  assert len(gpu_bench.plan(args)) == 8


def test_ratios_are_against_torch_compile_at_the_same_shape():
  row = lambda name, seq, batch, tps: gpu_bench.summarize(
      {"record": "contender", "run_id": "r", "contender": name, "preset": "base", "seq": seq,
       "batch": batch, "status": "ok", "setup_s": 1.0, "first_step_s": 2.0,
       "step_s_all": [seq * batch / tps]}, 989.0)
  report = gpu_bench.report_markdown([
      row("torch_compile", 128, 256, 100_000.0), row("jaxencoder", 128, 256, 150_000.0),
      row("torch_compile", 512, 64, 50_000.0), row("jaxencoder", 512, 64, 100_000.0)])
  ratio = {tuple(cells[:2]): cells[-1] for cells in
           (line.strip("| ").split(" | ") for line in report.splitlines() if line[2:3].isdigit())}
  assert ratio == {("128 x 256", "torch_compile"): "1.00", ("128 x 256", "jaxencoder"): "1.50",
                   ("512 x 64", "torch_compile"): "1.00", ("512 x 64", "jaxencoder"): "2.00"}


@pytest.mark.slow
def test_dry_run_prints_a_command_per_contender_and_shape():
  proc = subprocess.run([os.path.join(REPO, "bench", "gpu.sh"), "--dry-run"], capture_output=True,
                        text=True, env=dict(os.environ, PY=sys.executable))
  assert proc.returncode == 0, proc.stderr
  commands = [line for line in proc.stdout.splitlines() if "--worker" in line]
  assert len(commands) == 8 and all("--attention auto --rng-impl rbg" in c for c in commands)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_gpu_sh_refuses_to_run_without_a_gpu():
  proc = subprocess.run([os.path.join(REPO, "bench", "gpu.sh")], capture_output=True, text=True,
                        env=dict(os.environ, PY=sys.executable))
  assert proc.returncode != 0 and "no NVIDIA GPU" in proc.stderr
