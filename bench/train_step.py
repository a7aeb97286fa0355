"""MLM train step (forward + backward + AdamW): jaxencoder vs HF Flax BERT vs PyTorch BERT.

  # jaxencoder only (main venv):
  .venv/bin/python bench/train_step.py --configs small128
  # with the baselines (transformers<5 in its own venv, see docs/performance.md):
  .venv/bin/python bench/train_step.py --baseline-python /tmp/hfflax/bin/python

Each contender runs in its own worker process (so peak RSS is its own); the
orchestrator alternates one timed step per contender per round, so load from other
processes hits all contenders alike. Contenders:
  jaxencoder       logits only at the M masked positions (max_predictions=M)
  jaxencoder_full  logits at every position (max_predictions=0), like the baselines
  hf_flax          transformers' FlaxBertForMaskedLM + optax clip + adamw
  torch            transformers' BertForMaskedLM + clip_grad_norm_ + torch.optim.AdamW (eager)
All start from the same weights (jaxencoder's init, written as a BERT checkpoint);
before training, each computes the full-logits loss of the same batch without
dropout, to check that the maths is identical.

Train FLOPs per step (matmuls only; 3x forward: forward + two backward matmuls):
  full logits:  3 * [B*L*N*(8*D^2 + 4*D*F + 4*L*D) + B*L*(2*D^2 + 2*D*V)]
              = 6 * N_matmul_params * T + 12*N*L*D*T + 6*(D^2 + D*V)*T  (T = B*L tokens)
  jaxencoder:   the same with P = M rows in the head, and the last block at
                B*L rows for its K/V projections (4*D^2) but only B*(1 + M) rows
                ([CLS] + masked) for the rest (4*D^2 + 4*D*F + 4*L*D)
(`train_flops`). MFU is achieved FLOP/s over the f32 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> (preset, seq_len, batch_size)
CONFIGS = {"small128": ("small", 128, 16), "base128": ("base", 128, 8),
           "base512": ("base", 512, 2)}
# preset -> (layers, width, heads), as jaxencoder.model.config.PRESETS (not imported: the
# baseline venv and the PyTorch contenders load this module without jaxencoder).
SIZES = {"tiny": (2, 128, 2), "small": (4, 512, 8), "base": (12, 768, 12)}
VOCAB = 30522
MASK_RATE = 0.15
LR, B1, B2, EPS, WD, CLIP = 1e-4, 0.9, 0.999, 1e-6, 0.01, 1.0
JAX_KINDS = ("jaxencoder", "jaxencoder_full")
BASELINE_KINDS = ("hf_flax", "torch")


# ---------------------------------------------------------------- shared maths
def num_predictions(seq_len: int) -> int:
  return round(MASK_RATE * seq_len)


def make_batch(batch_size: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Random ids with exactly round(15% * L) masked positions per row (never [CLS])."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1000, VOCAB, (batch_size, seq_len), dtype=np.int32)
  ids[:, 0] = 101  # [CLS]
  weights = np.zeros((batch_size, seq_len), np.float32)
  for row in weights:
    row[1 + rng.choice(seq_len - 1, num_predictions(seq_len), replace=False)] = 1.0
  labels = ids.copy()
  inputs = np.where(weights > 0, 103, ids).astype(np.int32)  # [MASK]
  return {"input_ids": inputs, "attention_mask": np.ones_like(ids),
          "token_type_ids": np.zeros_like(ids), "mlm_labels": labels, "mlm_weights": weights}


def train_flops(preset: str, batch_size: int, seq_len: int, predictions: int) -> float:
  """Matmul FLOPs of one train step (3x the forward's), as each contender computes them.

  `predictions` P < L means jaxencoder's sparse path: logits at P rows, and the last
  block's queries, attention, output projection and feed-forward at 1 + P rows
  ([CLS] + masked), its key/value projections at all L.
  """
  n, d, _ = SIZES[preset]
  f = 4 * d
  per_row_layer = 8 * d * d + 4 * d * f + 4 * seq_len * d
  head = 2 * d * d + 2 * d * VOCAB
  if predictions >= seq_len:
    encoder = batch_size * seq_len * n * per_row_layer
  else:
    last_rows = 1 + predictions
    last = batch_size * (seq_len * 4 * d * d + last_rows * (per_row_layer - 4 * d * d))
    encoder = batch_size * seq_len * (n - 1) * per_row_layer + last
  return 3.0 * (encoder + batch_size * predictions * head)


def weighted_ce(logits, labels, weights) -> float:
  """Mean cross-entropy over weighted positions, in numpy (float64) for the parity check."""
  logits = np.asarray(logits, np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  picked = np.take_along_axis(logits, labels[..., None].astype(np.int64), -1)[..., 0]
  return float(((logz - picked) * weights).sum() / weights.sum())


# ---------------------------------------------------------------- runners (in workers)
def import_train_modules():
  """(optim, steps, tasks.registry), also where the data pipeline cannot import.

  The package's __init__ imports the training loop and with it grain and
  tensorflow_datasets, which the step does not use and an accelerator image may lack
  (the H200 one does); then the three modules load under a bare package object.
  """
  try:
    from jaxencoder.tasks import registry
    from jaxencoder.train import optim, steps
  except ImportError as e:
    import importlib
    import types
    import jaxencoder
    print(f"# jaxencoder.train: {e}; loading optim, steps without its __init__",
          file=sys.stderr, flush=True)
    package = types.ModuleType("jaxencoder.train")
    package.__path__ = [os.path.join(os.path.dirname(jaxencoder.__file__), "train")]
    sys.modules["jaxencoder.train"] = package
    optim, steps = (importlib.import_module(f"jaxencoder.train.{name}")
                    for name in ("optim", "steps"))
    registry = importlib.import_module("jaxencoder.tasks.registry")
  return optim, steps, registry


class JaxencoderRunner:
  """steps.train_step with make_optimizer's AdamW (constant LR, clip 1.0), state donated.

  `rng_impl` (threefry2x32, rbg, unsafe_rbg; None: jax's default) makes the init and
  dropout keys; the step's metrics of the last call stay in `metrics`.
  """

  def __init__(self, preset, batch, full_logits, rng_impl=None, **model):
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from jaxencoder import EncoderConfig
    optim, steps, registry = import_train_modules()
    make_key = lambda seed: jax.random.key(seed, impl=rng_impl)
    self.cfg = EncoderConfig.preset(preset, vocab_size=VOCAB, max_len=512, **model)
    m = 0 if full_logits else num_predictions(batch["input_ids"].shape[1])
    self.task = registry.make_task("mlm", self.cfg, max_predictions=m)
    self.batch = {k: jnp.asarray(v) for k, v in batch.items()}
    init = jax.jit(lambda key: self.task.model.init(key, *self.task.example_batch(self.batch)))
    self.params = nn.meta.unbox(init(make_key(0))["params"])
    ocfg = optim.default_optim_config()
    ocfg.update(learning_rate=LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD, grad_clip_norm=CLIP,
                schedule="constant")
    tx, _ = optim.make_optimizer(ocfg, self.params, num_layers=self.cfg.num_layers)
    self.state = steps.TrainState(jnp.zeros((), jnp.int32), self.params, tx.init(self.params),
                                  jnp.full((), -1, jnp.int32))
    fn = lambda s, b: steps.train_step(s, b, task=self.task, tx=tx, base_rng=make_key(1))
    self.jitted = jax.jit(fn, donate_argnums=0)
    full = registry.make_task("mlm", self.cfg, max_predictions=0)
    self.eval_loss_fn = jax.jit(lambda p, b: full.loss_fn(p, b, jax.random.key(0), False)[0])

  def compile(self) -> dict:
    start = time.perf_counter()
    self.step_fn = self.jitted.lower(self.state, self.batch).compile()
    secs = time.perf_counter() - start
    cost = self.step_fn.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"compile_s": secs, "xla_flops": float((cost or {}).get("flops", -1))}

  def save(self, path):
    from jaxencoder.pretrained import hf_checkpoint
    hf_checkpoint.save(path, self.cfg.replace(dtype="float32"), self.params)

  def eval_loss(self) -> float:
    return float(self.eval_loss_fn(self.params, self.batch))

  def step(self):
    self.state, self.metrics = self.step_fn(self.state, self.batch)
    common.block((self.state, self.metrics))


class HfFlaxRunner:
  """FlaxBertForMaskedLM + optax.chain(clip_by_global_norm, adamw), state donated."""

  def __init__(self, preset, batch, model_dir):
    import jax
    import jax.numpy as jnp
    import optax
    from transformers import FlaxBertForMaskedLM
    self.model = FlaxBertForMaskedLM.from_pretrained(model_dir, from_pt=True)
    self.batch = {k: jnp.asarray(v) for k, v in batch.items()}
    tx = optax.chain(optax.clip_by_global_norm(CLIP),
                     optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD))
    self.params = self.model.params
    self.state = (self.params, tx.init(self.params), jax.random.key(1))

    def loss_fn(params, b, rng, train):
      logits = self.model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                          params=params, dropout_rng=rng, train=train).logits
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, b["mlm_labels"])
      return jnp.sum(ce * b["mlm_weights"]) / jnp.sum(b["mlm_weights"])

    def step(state, b):
      params, opt_state, rng = state
      rng, sub = jax.random.split(rng)
      loss, grads = jax.value_and_grad(loss_fn)(params, b, sub, True)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state, rng), loss

    self.jitted = jax.jit(step, donate_argnums=0)
    self.eval_loss_fn = jax.jit(lambda p, b: loss_fn(p, b, None, False))

  def compile(self) -> dict:
    start = time.perf_counter()
    self.step_fn = self.jitted.lower(self.state, self.batch).compile()
    return {"compile_s": time.perf_counter() - start}

  def eval_loss(self) -> float:
    return float(self.eval_loss_fn(self.params, self.batch))

  def step(self):
    self.state, loss = self.step_fn(self.state, self.batch)
    common.block((self.state, loss))


class TorchRunner:
  """BertForMaskedLM (eager, train mode) + clip_grad_norm_ + torch.optim.AdamW."""

  def __init__(self, preset, batch, model_dir):
    import torch
    from transformers import BertForMaskedLM
    torch.set_num_threads(os.cpu_count())
    self.torch = torch
    self.model = BertForMaskedLM.from_pretrained(model_dir, attn_implementation="eager")
    self.batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    self.labels = torch.where(self.batch["mlm_weights"] > 0, self.batch["mlm_labels"].long(),
                              torch.full_like(self.batch["mlm_labels"].long(), -100))
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=(B1, B2), eps=EPS,
                                 weight_decay=WD)

  def _forward(self, labels=None):
    b = self.batch
    return self.model(input_ids=b["input_ids"].long(), attention_mask=b["attention_mask"].long(),
                      token_type_ids=b["token_type_ids"].long(), labels=labels)

  def compile(self) -> dict:
    return {"compile_s": 0.0}  # eager: nothing to compile; the warm-up step is untimed

  def eval_loss(self) -> float:
    self.model.eval()
    with self.torch.no_grad():
      logits = self._forward().logits.numpy()
    self.model.train()
    return weighted_ce(logits, self.batch["mlm_labels"].numpy(),
                       self.batch["mlm_weights"].numpy())

  def step(self):
    self.opt.zero_grad(set_to_none=True)
    self._forward(self.labels).loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
    self.opt.step()


def worker_main(kind: str) -> None:
  """Serves JSON commands on stdin; replies are stdout lines starting with '@@ '."""
  runner = None
  for line in sys.stdin:
    cmd = json.loads(line)
    op, reply = cmd["op"], {}
    try:
      if op == "setup":
        batch = dict(np.load(cmd["batch"]))
        if kind in JAX_KINDS:
          runner = JaxencoderRunner(cmd["preset"], batch, full_logits=kind == "jaxencoder_full",
                                    **cmd.get("model", {}))
          if cmd.get("save"):
            runner.save(cmd["save"])
        else:
          cls = HfFlaxRunner if kind == "hf_flax" else TorchRunner
          runner = cls(cmd["preset"], batch, cmd["model_dir"])
        reply = runner.compile()
        reply["versions"] = common.machine_info()
      elif op == "eval_loss":
        reply = {"loss": runner.eval_loss()}
      elif op == "step":
        reply = {"times": [common.timed(runner.step)[0] for _ in range(cmd["n"])]}
      elif op == "rss":
        reply = {"peak_rss_mib": common.peak_rss_mib()}
      elif op == "quit":
        return
    except Exception as e:  # report, keep serving
      import traceback
      reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    print("@@ " + json.dumps(reply), flush=True)


# ---------------------------------------------------------------- orchestrator
class Worker:
  """A contender in its own process: `python train_step.py --worker KIND`."""

  def __init__(self, kind: str, python: str, log_dir: str):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle torch threads must not spin
    self.kind, self.log = kind, open(os.path.join(log_dir, f"{kind}.log"), "w")
    self.proc = subprocess.Popen([python, os.path.abspath(__file__), "--worker", kind],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.log, text=True, env=env)

  def call(self, **cmd) -> dict:
    self.proc.stdin.write(json.dumps(cmd) + "\n")
    self.proc.stdin.flush()
    for line in self.proc.stdout:
      if line.startswith("@@ "):
        reply = json.loads(line[3:])
        if "error" in reply:
          raise RuntimeError(f"{self.kind}: {reply['error']}\n{reply.get('trace', '')}"
                             f"(log: {self.log.name})")
        return reply
    raise RuntimeError(f"{self.kind} worker died; see {self.log.name}")

  def close(self):
    try:
      self.call(op="quit")
    except RuntimeError:
      pass
    self.proc.wait(timeout=60)


def run_config(name, kinds, args, tmp, peaks: list[float]) -> list[dict]:
  preset, seq_len, batch_size = CONFIGS[name]
  batch_size = args.batch_size or batch_size
  batch_file = os.path.join(tmp, f"{name}.npz")
  np.savez(batch_file, **make_batch(batch_size, seq_len))
  model_dir = os.path.join(tmp, f"{name}_bert")
  workers, rows = [], {}
  try:
    for kind in kinds:  # one at a time: compile times are not measured concurrently
      python = args.baseline_python if kind in BASELINE_KINDS else sys.executable
      w = Worker(kind, python, tmp)
      workers.append(w)
      save = model_dir if kind == kinds[0] else None
      rows[kind] = {"config": name, "framework": kind, "batch": batch_size, "seq": seq_len,
                    **w.call(op="setup", preset=preset, batch=batch_file, model_dir=model_dir,
                             save=save, model=model_overrides(args))}
      rows[kind]["eval_loss"] = w.call(op="eval_loss")["loss"]
      w.call(op="step", n=1)  # warm-up
      print(f"# {name} {kind}: ready (compile {rows[kind]['compile_s']:.1f}s)",
            file=sys.stderr, flush=True)
    times = {k: [] for k in kinds}
    for _ in range(args.rounds):  # alternate contenders round by round
      for w in workers:
        times[w.kind] += w.call(op="step", n=args.steps_per_round)["times"]
      peaks.append(common.matmul_peak_flops(repeats=3, dtype=args.dtype))  # same load
    for w in workers:
      rows[w.kind]["peak_rss_mib"] = w.call(op="rss")["peak_rss_mib"]
  finally:
    for w in workers:
      w.close()
  return [_summarize(rows[k], times[k], preset) for k in kinds]


def model_overrides(args) -> dict:
  """EncoderConfig fields for the jaxencoder contenders (the baselines stay float32 BERT)."""
  out = {"dtype": args.dtype, "attention_impl": args.attention}
  if args.no_attention_dropout:  # `fused` falls back to `xla` while attention dropout is on
    out["attention_dropout_rate"] = 0.0
  return out


def _summarize(row, times, preset) -> dict:
  seq_len, batch_size = row["seq"], row["batch"]
  preds = num_predictions(seq_len) if row["framework"] == "jaxencoder" else seq_len
  step_s = common.median(times)
  flops = train_flops(preset, batch_size, seq_len, preds)
  row.pop("versions", None)
  return {**row, "step_s": step_s, "step_s_all": times, "tokens_per_s": batch_size * seq_len / step_s,
          "model_flops": flops, "flop_per_s": flops / step_s, "predicted_per_row": preds}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default="small128,base128",
                      help=f"comma list of {sorted(CONFIGS)}")
  parser.add_argument("--frameworks", default=None,
                      help="comma list; default: jaxencoder,jaxencoder_full (+ baselines "
                           "when --baseline-python is given)")
  parser.add_argument("--baseline-python", default=None,
                      help="interpreter with transformers<5, flax and torch")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps-per-round", type=int, default=1)
  parser.add_argument("--batch-size", type=int, default=None, help="override every config's")
  parser.add_argument("--list-configs", action="store_true", help="print CONFIGS and exit")
  parser.add_argument("--dtype", default="float32", help="jaxencoder compute dtype")
  parser.add_argument("--attention", default="xla", help="jaxencoder attention_impl")
  parser.add_argument("--no-attention-dropout", action="store_true",
                      help="attention_dropout_rate=0 (lets `fused` use cuDNN while training)")
  parser.add_argument("--peak-tflops", type=float, default=None,
                      help="MFU against this datasheet peak instead of the measured matmul")
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    return worker_main(args.worker)
  if args.list_configs:
    return print({k: dict(zip(("preset", "seq_len", "batch"), v)) for k, v in CONFIGS.items()})
  kinds = (args.frameworks.split(",") if args.frameworks else
           list(JAX_KINDS) + (list(BASELINE_KINDS) if args.baseline_python else []))
  if any(k in BASELINE_KINDS for k in kinds) and not args.baseline_python:
    parser.error("baselines need --baseline-python (transformers<5)")
  peaks = [common.matmul_peak_flops(dtype=args.dtype)]
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.configs.split(","):
      results += run_config(name, kinds, args, tmp, peaks)
  report(results, peaks, args)


def report(results, peaks, args):
  """MFU against the best matmul rate seen (measured between rounds, same load)."""
  peak = args.peak_tflops * 1e12 if args.peak_tflops else max(peaks)
  by = {(r["config"], r["framework"]): r for r in results}
  for r in results:
    ref = by.get((r["config"], kinds_ref(by, r["config"])))
    r["mfu"] = r["flop_per_s"] / peak
    r["loss_diff_vs_jaxencoder"] = abs(r["eval_loss"] - ref["eval_loss"]) if ref else None
    for base in BASELINE_KINDS:
      b = by.get((r["config"], base))
      if b:
        r[f"x_vs_{base}"] = r["tokens_per_s"] / b["tokens_per_s"]
  common.print_json({"benchmark": "train_step", "date": time.strftime("%Y-%m-%d"),
                     "machine": common.machine_info(), "matmul_peak_flop_per_s": peak,
                     "matmul_peaks": peaks, "rounds": args.rounds,
                     "steps_per_round": args.steps_per_round, "mfu_peak_flop_per_s": peak,
                     "model": model_overrides(args), "results": results})
  print(f"{args.dtype} matmul (4096^2 jnp.dot): best {max(peaks) / 1e9:.1f} GFLOP/s, median "
        f"{common.median(peaks) / 1e9:.1f} over {len(peaks)} measurements between rounds; "
        f"MFU denominator {peak / 1e9:.1f} GFLOP/s")
  cols = ["config", "framework", "batch", "seq", "compile_s", "step_s", "tokens_per_s",
          "peak_rss_mib", "model_flops", "flop_per_s", "mfu", "x_vs_hf_flax", "x_vs_torch",
          "eval_loss", "loss_diff_vs_jaxencoder"]
  common.print_table(results, cols)


def kinds_ref(by, config):
  return "jaxencoder" if (config, "jaxencoder") in by else "jaxencoder_full"


if __name__ == "__main__":
  main()
