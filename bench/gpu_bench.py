"""MLM train step on one GPU: jaxencoder and its PyTorch anchor, measured in the same run.

  bench/gpu.sh                                   # one NVIDIA GPU; under 8 minutes
  bench/gpu.sh --dry-run                         # the contender commands (any machine)
  .venv/bin/python bench/gpu_bench.py --tiny --attention xla --out /tmp/gpu_bench  # on CPU
  .venv/bin/python bench/gpu_bench.py --report DIR   # DIR/report.md from DIR/results.jsonl

The BERT-base MLM train step (forward + backward + grad clip 1.0 + AdamW), bf16 compute
with float32 parameters, attention dropout 0, hidden dropout 0.1, B*L = 32k tokens at
L = 128 and L = 512. Contenders:
  torch            transformers' BertForMaskedLM (random init, sdpa attention) under
                   torch.autocast(bf16), clip_grad_norm_, torch.optim.AdamW(fused=True);
                   logits at every position
  torch_compile    the same with the model under torch.compile (clip and AdamW eager)
  jaxencoder_full  steps.train_step + make_optimizer, logits at every position
  jaxencoder       the same with logits at the round(0.15 L) masked positions only
Each contender is its own process with its own timeout; its JSON line is appended to
DIR/results.jsonl the moment it ends (failed, timed out and skipped ones too), and
DIR/report.md is rebuilt from that file at the end, or by --report from whatever a
cut-short run left.

Per contender: `setup_s` (process start to ready: imports, model, optimizer, batch on
the device), `first_step_s` (the first step, compilation included), `step_s` (median of
the timed steps, each synchronised), tokens/s, MFU and peak device memory. MFU uses
train_step.train_flops for everyone: `mfu` counts the FLOPs the contender computes,
`mfu_bert` the full-logits BERT step's over the same time ("BERT-equivalent"); they
differ only for the sparse `jaxencoder`.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # a worker's setup_s counts from here, imports included

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import train_step as ts  # noqa: E402

REPO = ts.REPO
CONTENDERS = ("torch", "torch_compile", "jaxencoder_full", "jaxencoder")
JAX_CONTENDERS = ("jaxencoder_full", "jaxencoder")
ANCHOR = "torch_compile"
# A run cut by its deadline keeps what matters most: the anchor and the sparse step at
# every shape come first, then eager torch and the full-logits step.
PRIORITY = {"torch_compile": 0, "jaxencoder": 0, "torch": 1, "jaxencoder_full": 1}
RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}
DTYPE = "bfloat16"
RESULTS, REPORT, LOG = "results.jsonl", "report.md", "contenders.log"
# The full run and the CPU rehearsal of its orchestration (flags left unset take these).
FULL = dict(preset="base", shapes="128x256,512x64", warmup=3, steps=20, device="gpu")
TINY = dict(preset="tiny", shapes="32x4,64x2", warmup=1, steps=2, device="cpu")


# ---------------------------------------------------------------- contenders (in workers)
class JaxContender:
  """jaxencoder's train step (train_step.JaxencoderRunner) on jax's default device."""

  def __init__(self, args, batch):
    import jax
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
    if args.device == "gpu" and jax.default_backend() != "gpu":
      raise RuntimeError(f"jax's backend is {jax.default_backend()!r}, not 'gpu': run with a "
                         "python whose jax has CUDA (PY=... bench/gpu.sh)")
    self.jax, self.cache_events = jax, collections.Counter()
    jax.monitoring.register_event_listener(self._count_cache_event)
    self.runner = ts.JaxencoderRunner(
        args.preset, batch, full_logits=args.worker == "jaxencoder_full",
        rng_impl=RNG_IMPLS[args.rng_impl], dtype=DTYPE, attention_impl=args.attention,
        attention_dropout_rate=0.0)
    self.info = {"attention": resolved_attention(self.runner.cfg), "rng_impl": args.rng_impl}

  def _count_cache_event(self, event, **_):
    if event.startswith("/jax/compilation_cache/cache_"):  # cache_hits, cache_misses
      self.cache_events[event.rsplit("/", 1)[1]] += 1

  def first_step(self):
    before = dict(self.cache_events)
    self.info.update(self.runner.compile())  # compile_s, xla_flops
    hit = self.cache_events["cache_hits"] > before.get("cache_hits", 0)
    miss = self.cache_events["cache_misses"] > before.get("cache_misses", 0)
    self.info["compile_cache"] = "hit" if hit else "miss" if miss else "off"
    self.runner.step()

  def step(self):
    self.runner.step()

  def loss(self) -> float:
    return float(self.runner.metrics["loss"])

  def finish(self) -> dict:
    device = self.jax.devices()[0]
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")  # None on CPU
    return {**self.info, "device_name": device.device_kind,
            "peak_mem_gib": peak / 2**30 if peak else None}


def resolved_attention(cfg) -> str:
  """What a training call's attention runs, e.g. 'auto->cudnn' (attention dropout is 0)."""
  try:
    from jaxencoder.model.flash import plan_attention
  except ImportError:  # a library from before attention_impl='auto'
    return cfg.attention_impl
  impl = plan_attention(cfg).impl
  return impl if impl == cfg.attention_impl else f"{cfg.attention_impl}->{impl}"


class TorchContender:
  """BertForMaskedLM from a BertConfig (random init, sdpa) + bf16 autocast + fused AdamW."""

  def __init__(self, args, batch):
    import torch
    from transformers import BertConfig, BertForMaskedLM
    self.torch, self.cuda = torch, args.device == "gpu"
    if self.cuda and not torch.cuda.is_available():
      raise RuntimeError("torch sees no CUDA device")
    device = torch.device("cuda" if self.cuda else "cpu")
    if not self.cuda:
      torch.set_num_threads(os.cpu_count())
    layers, width, heads = ts.SIZES[args.preset]
    config = BertConfig(vocab_size=ts.VOCAB, hidden_size=width, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * width,
                        max_position_embeddings=512, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertForMaskedLM(config).to(device).train()
    self.params = list(model.parameters())
    self.opt = torch.optim.AdamW(self.params, lr=ts.LR, betas=(ts.B1, ts.B2), eps=ts.EPS,
                                 weight_decay=ts.WD, fused=True)
    self.model = torch.compile(model) if args.worker == "torch_compile" else model
    as_long = lambda name: torch.from_numpy(batch[name]).long().to(device)
    self.inputs = {k: as_long(k) for k in ("input_ids", "attention_mask", "token_type_ids")}
    masked = torch.from_numpy(batch["mlm_weights"]).to(device) > 0
    self.labels = torch.where(masked, as_long("mlm_labels"), -100)  # loss at masked rows
    self.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    self.info = {"attention": model.config._attn_implementation}
    if self.cuda:
      torch.cuda.reset_peak_memory_stats()

  def step(self):
    self.opt.zero_grad(set_to_none=True)
    with self.autocast():
      loss = self.model(**self.inputs, labels=self.labels).loss
    loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.params, ts.CLIP)
    self.opt.step()
    self.last_loss = loss.detach()
    if self.cuda:
      self.torch.cuda.synchronize()

  first_step = step  # torch.compile compiles inside the first call

  def loss(self) -> float:
    return float(self.last_loss)

  def finish(self) -> dict:
    torch = self.torch
    if not self.cuda:
      return {**self.info, "device_name": common.machine_info()["processor"], "peak_mem_gib": None}
    return {**self.info, "device_name": torch.cuda.get_device_name(),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def worker_main(args) -> None:
  """Runs one contender and prints its measurements as one '@@ ' JSON line."""
  batch = ts.make_batch(args.batch, args.seq)
  contender = (JaxContender if args.worker in JAX_CONTENDERS else TorchContender)(args, batch)
  out = {"setup_s": time.perf_counter() - T0}
  out["first_step_s"] = common.timed(contender.first_step)[0]
  out["loss_first"] = contender.loss()
  for _ in range(args.warmup - 1):
    contender.step()
  out["step_s_all"] = common.repeat_times(contender.step, args.steps)
  out["loss_last"] = contender.loss()
  out.update(contender.finish(), peak_rss_mib=common.peak_rss_mib(),
             versions=common.machine_info())
  print("@@ " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- orchestrator
def plan(args) -> list[tuple[str, int, int]]:
  """(contender, seq, batch) in run order: PRIORITY first, then shape, then as listed."""
  shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
  names = args.contenders.split(",")
  unknown = sorted(set(names) - set(CONTENDERS))
  if unknown:
    raise SystemExit(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
  runs = [(c, seq, batch) for seq, batch in shapes for c in names]
  return sorted(runs, key=lambda r: PRIORITY[r[0]])  # stable: shape order kept


def worker_command(args, contender: str, seq: int, batch: int) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), "--worker", contender,
          "--preset", args.preset, "--seq", str(seq), "--batch", str(batch),
          "--warmup", str(args.warmup), "--steps", str(args.steps), "--device", args.device,
          "--attention", args.attention, "--rng-impl", args.rng_impl,
          "--cache-dir", args.cache_dir]


def worker_env(args) -> dict[str, str]:
  env = dict(os.environ, PYTHONUNBUFFERED="1",
             PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
  # XLA_PYTHON_CLIENT_PREALLOCATE is left as it is (on: XLA's pool takes 75% of the GPU):
  # contenders run one at a time and this process never initialises the GPU, so a jax
  # contender is set up as it would be in training; its peak_bytes_in_use counts the
  # step's buffers, not the pool.
  if args.device == "cpu":
    env["JAX_PLATFORMS"] = "cpu"
  return env


def run_contender(command, env, timeout_s: float, log) -> dict:
  """Runs one worker and returns its record.

  The worker leads its own process group (torch.compile's compiler processes included),
  killed whole on timeout or when this process is interrupted; it stays in this session,
  so whatever ends the session ends it too.
  """
  start = time.perf_counter()
  timed_out = False
  with tempfile.TemporaryFile("w+") as out:  # a file, not a pipe: no deadlock on kill
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=os.setpgrp)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out.seek(0)
    text = out.read()
  log.write(f"\n===== {shlex.join(command)}\n{text}")
  log.flush()
  rc = proc.returncode
  record = {"wall_s": time.perf_counter() - start, "timeout_s": timeout_s, "returncode": rc}
  replies = [line[3:] for line in text.splitlines() if line.startswith("@@ ")]
  tail = [line for line in text.splitlines() if line.strip()][-15:]
  if replies:  # measured (even if then killed while exiting)
    return {**record, "status": "ok", **json.loads(replies[-1])}
  if timed_out:
    return {**record, "status": "timeout", "error": f"killed after {timeout_s:.0f} s",
            "log_tail": tail}
  error = last_exception(tail)
  if rc < 0:  # e.g. the kernel's out-of-memory killer: no traceback
    error = f"killed by signal {-rc}; last output: {error}"
  return {**record, "status": "failed", "error": error, "log_tail": tail}


def last_exception(lines: list[str]) -> str:
  """The last 'SomeError: message' line (torch prints hints after it), else the last line."""
  found = [l for l in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b", l)]
  return (found or lines or ["no output"])[-1].strip()


def summarize(record: dict, peak_tflops: float) -> dict:
  """Adds step_s, tokens/s, both FLOP counts and both MFUs to a measured record."""
  if record.get("status") != "ok":
    return record
  preset, seq, batch = record["preset"], record["seq"], record["batch"]
  predictions = ts.num_predictions(seq) if record["contender"] == "jaxencoder" else seq
  step_s = common.median(record["step_s_all"])
  flops = ts.train_flops(preset, batch, seq, predictions)
  flops_bert = ts.train_flops(preset, batch, seq, seq)
  peak = peak_tflops * 1e12
  return {**record, "predictions_per_row": predictions, "step_s": step_s,
          "tokens_per_s": batch * seq / step_s, "flops": flops, "flops_bert": flops_bert,
          "mfu": flops / step_s / peak, "mfu_bert": flops_bert / step_s / peak}


def append_record(out_dir: str, record: dict) -> None:
  with open(os.path.join(out_dir, RESULTS), "a") as f:
    f.write(json.dumps(record) + "\n")


def run_record(args, run_id: str, gpu: str | None) -> dict:
  keys = ("preset", "shapes", "contenders", "warmup", "steps", "device", "attention",
          "rng_impl", "peak_tflops", "deadline", "timeout", "cache_dir")
  return {"record": "run", "run_id": run_id, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
          "gpu": gpu, "dtype": DTYPE, "host": common.machine_info(),
          **{k: getattr(args, k) for k in keys}}


def run(args, gpu: str | None) -> None:
  """Runs the plan against the deadline (counted from this process's start), appending
  each record as it comes; the report is written even when the run is interrupted."""
  os.makedirs(args.out, exist_ok=True)
  start, run_id = T0, time.strftime("%Y%m%d-%H%M%S")
  append_record(args.out, run_record(args, run_id, gpu))
  env = worker_env(args)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally clauses
  try:
    with open(os.path.join(args.out, LOG), "a") as log:
      for contender, seq, batch in plan(args):
        head = {"record": "contender", "run_id": run_id, "contender": contender,
                "preset": args.preset, "seq": seq, "batch": batch}
        try:
          record = summarize(run_one(args, head, env, start, log), args.peak_tflops)
        except (KeyboardInterrupt, SystemExit):
          append_record(args.out, {**head, "status": "interrupted", "error": "run stopped"})
          raise
        append_record(args.out, record)
        print(f"[{time.perf_counter() - start:5.0f} s] {progress_line(record)}", flush=True)
  finally:
    print(write_report(args.out), flush=True)


def run_one(args, head: dict, env, start: float, log) -> dict:
  """The contender's record, or a skipped one when the deadline is too near."""
  left = args.deadline - (time.perf_counter() - start)
  if left < args.min_start:
    return {**head, "status": "skipped",
            "error": f"deadline: {max(left, 0):.0f} s of {args.deadline:.0f} s left"}
  command = worker_command(args, head["contender"], head["seq"], head["batch"])
  return {**head, "command": shlex.join(command),
          **run_contender(command, env, min(args.timeout, left), log)}


def progress_line(r: dict) -> str:
  name = f"{r['contender']} {r['seq']}x{r['batch']}"
  if r["status"] != "ok":
    return f"{name}: {r['status']}: {r.get('error', '')}"
  return (f"{name}: step {r['step_s'] * 1e3:.1f} ms, {r['tokens_per_s']:,.0f} tokens/s, "
          f"BERT-eq MFU {r['mfu_bert']:.1%} (setup {r['setup_s']:.1f} s, "
          f"first step {r['first_step_s']:.1f} s)")


# ---------------------------------------------------------------- report
def read_records(out_dir: str) -> list[dict]:
  """Every complete JSON line of DIR/results.jsonl (a line cut by a kill is dropped)."""
  records = []
  with open(os.path.join(out_dir, RESULTS)) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def write_report(out_dir: str) -> str:
  text = report_markdown(read_records(out_dir))
  with open(os.path.join(out_dir, REPORT), "w") as f:
    f.write(text)
  return text


def report_markdown(records: list[dict]) -> str:
  """One table per run (in file order), ratios against torch_compile at the same shape."""
  runs: dict[str, dict] = {}
  for r in records:
    run = runs.setdefault(r["run_id"], {"run": None, "rows": []})
    if r.get("record") == "run":
      run["run"] = r
    else:
      run["rows"].append(r)
  parts = ["# MLM train step: jaxencoder vs PyTorch (bench/gpu_bench.py)", ""]
  for run_id, run in runs.items():
    parts += run_header(run_id, run["run"], run["rows"]) + run_table(run["rows"]) + [""]
    parts += [f"- {r['contender']} {r['seq']}x{r['batch']}: {r['status']}: {r.get('error', '')}"
              for r in run["rows"] if r["status"] != "ok"]
    parts.append("")
  return "\n".join(parts).rstrip() + "\n"


def run_header(run_id: str, run: dict | None, rows: list[dict]) -> list[str]:
  versions = {}
  for r in rows:
    for mod in ("jax", "flax", "torch", "transformers"):
      versions.setdefault(mod, (r.get("versions") or {}).get(mod))
  lines = [f"## Run {run_id}", ""]
  if run:
    device = run["gpu"] or next((r["device_name"] for r in rows if r.get("device_name")), "CPU")
    lines.append(f"{run['date']}, {device}; preset {run['preset']}, {run['dtype']} compute, "
                 f"jax attention `{run['attention']}`, rng `{run['rng_impl']}`; "
                 f"{run['warmup']} warm-up + {run['steps']} timed steps (median); "
                 f"MFU of {run['peak_tflops']:g} TFLOP/s; deadline {run['deadline']:g} s.")
  lines += [", ".join(f"{k} {v}" for k, v in versions.items() if v) or "(no versions)", "",
            "MFU: `train_step.train_flops` of the step the contender computes / step time / "
            "peak; BERT-eq MFU: the full-logits BERT step's FLOPs over the same time.", ""]
  return lines


COLUMNS = ("L x B", "contender", "status", "attention", "setup s", "first step s",
           "compile cache", "step ms", "tokens/s", "MFU", "BERT-eq MFU", "peak GiB",
           "x torch.compile")


def run_table(rows: list[dict]) -> list[str]:
  anchor = {(r["seq"], r["batch"]): r["tokens_per_s"] for r in rows
            if r["contender"] == ANCHOR and r["status"] == "ok"}
  lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
  for r in sorted(rows, key=lambda r: (r["seq"], CONTENDERS.index(r["contender"]))):
    cells = [f"{r['seq']} x {r['batch']}", r["contender"], r["status"]]
    if r["status"] == "ok":
      ref = anchor.get((r["seq"], r["batch"]))
      cells += [r.get("attention", "-"), f"{r['setup_s']:.1f}", f"{r['first_step_s']:.1f}",
                r.get("compile_cache", "-"), f"{r['step_s'] * 1e3:.1f}",
                f"{r['tokens_per_s']:,.0f}", _pct(r["mfu"]), _pct(r["mfu_bert"]),
                _gib(r.get("peak_mem_gib")), f"{r['tokens_per_s'] / ref:.2f}" if ref else "-"]
    lines.append("| " + " | ".join(cells + ["-"] * (len(COLUMNS) - len(cells))) + " |")
  return lines


def _pct(x: float) -> str:
  return f"{x:.1%}" if x >= 1e-3 else f"{100 * x:.2g}%"


def _gib(x) -> str:
  return "-" if x is None else f"{x:.1f}"


# ---------------------------------------------------------------- entry point
def gpu_description() -> str | None:
  """nvidia-smi's name, driver, max SM clock and power limit of GPU 0; None without one."""
  query = "--query-gpu=name,driver_version,clocks.max.sm,power.limit"
  try:
    out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return None
  lines = out.stdout.strip().splitlines()
  return lines[0].strip() if out.returncode == 0 and lines else None


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results"),
                 help="results.jsonl, report.md and contenders.log go here (default $OUT, "
                      "else bench/results)")
  p.add_argument("--report", metavar="DIR", help="only rebuild DIR/report.md and print it")
  p.add_argument("--dry-run", action="store_true", help="print the contender commands only")
  p.add_argument("--tiny", action="store_true",
                 help=f"rehearse on CPU: {', '.join(f'{k}={v}' for k, v in TINY.items())}")
  p.add_argument("--contenders", default="torch_compile,jaxencoder,torch,jaxencoder_full",
                 help=f"comma list of {list(CONTENDERS)}")
  p.add_argument("--shapes", help=f"comma list of SEQxBATCH (default {FULL['shapes']})")
  p.add_argument("--preset", choices=sorted(ts.SIZES), help=f"default {FULL['preset']}")
  p.add_argument("--warmup", type=int, help="untimed steps, the first included (default 3)")
  p.add_argument("--steps", type=int, help="timed steps (default 20)")
  p.add_argument("--device", choices=("gpu", "cpu"), help="default gpu (--tiny: cpu)")
  p.add_argument("--attention", default="auto", help="jaxencoder attention_impl")
  p.add_argument("--rng-impl", default="rbg", choices=sorted(RNG_IMPLS),
                 help="jax PRNG for init and dropout keys")
  p.add_argument("--peak-tflops", type=float, default=989.0,
                 help="MFU denominator (H200 dense bf16: 989)")
  p.add_argument("--deadline", type=float, default=450.0,
                 help="seconds for the whole run; no contender starts past it")
  p.add_argument("--timeout", type=float, default=240.0, help="seconds per contender at most")
  p.add_argument("--min-start", type=float, default=60.0,
                 help="start no contender with fewer seconds than this left")
  # On a second run on the same machine the jax contenders compile from here. Not under
  # --out: a device run's output folder is emptied between calls and returns few files.
  p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(),
                                                     "jaxencoder-bench-jax-cache"),
                 help="jax persistent compilation cache")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  p.add_argument("--seq", type=int, help=argparse.SUPPRESS)
  p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  for key, value in (TINY if args.tiny else FULL).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return worker_main(args)
  if args.report:
    return print(write_report(args.report), end="")
  if args.dry_run:
    env = {k: v for k, v in worker_env(args).items() if k == "JAX_PLATFORMS"}
    for contender, seq, batch in plan(args):
      print(" ".join([*(f"{k}={v}" for k, v in env.items()),
                      shlex.join(worker_command(args, contender, seq, batch))]))
    return print(f"# results: {os.path.join(args.out, RESULTS)}; deadline {args.deadline:g} s")
  gpu = gpu_description() if args.device == "gpu" else None
  if args.device == "gpu" and gpu is None:
    sys.exit("bench/gpu.sh: no NVIDIA GPU here (nvidia-smi lists none). "
             "--dry-run prints the commands; --tiny rehearses the run on CPU.")
  run(args, gpu)


if __name__ == "__main__":
  main()
