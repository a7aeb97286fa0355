"""Effective (real-token) training throughput on Shakespeare: padded vs packed rows.

  .venv/bin/python -m jaxencoder.data fetch shakespeare --data-dir data   # once
  .venv/bin/python bench/packing.py --data-dir data [--preset small --seq-len 128 --batch 16]
  .venv/bin/python bench/packing.py --data-dir data --seq-len 1024 --batch 32 --compare-packing

--compare-packing times the input pipeline alone, no model: the first --batches batches
of greedy "pack" and of "best_fit" over the same stream of Shakespeare's stored token
ids (seed 0), made in this process; their fill (real tokens / slots) and real tokens/s.

Batches come from `mlm_pipeline(mode="pad"|"pack")` and are materialised first, so
the timed loop is the jitted MLM train step alone (bench/input_pipeline.py times the
pipeline). Both modes have the same shapes and keys (segment_ids, positions), so one
executable serves both; steps alternate pad / pack. Real tokens = attention_mask.sum().
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from jaxencoder import EncoderConfig  # noqa: E402
from jaxencoder.train import optim  # noqa: E402
from jaxencoder.train import steps  # noqa: E402
from jaxencoder.tasks import registry  # noqa: E402
from jaxencoder.data import builders, pipeline, sources  # noqa: E402
from jaxencoder.data.pipeline import Reading
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path  # noqa: E402

KEYS = ("input_ids", "attention_mask", "token_type_ids", "segment_ids", "positions",
        "mlm_labels", "mlm_weights")


def batches(source, tok, mode, seq_len, batch_size, count):
  ds = pipeline.mlm_pipeline(source, tok, seq_len=seq_len, batch_size=batch_size, mode=mode,
                             read=Reading(seed=0, num_epochs=None, shard_index=0, shard_count=1))
  return [{k: jnp.asarray(b[k]) for k in KEYS} for b in itertools.islice(iter(ds), count)]


def compare_packing(data_dir, tok, seq_len, batch_size, count):
  """A row per packing mode: fill and real tokens made per second over `count` batches."""
  source = sources.open_source(str(builders.prepare_fetched(
      "shakespeare", data_dir, default_tokenizer_path())), "train")
  rows = []
  for mode in ("pack", "best_fit"):
    ds = pipeline.mlm_pipeline(source, tok, seq_len=seq_len, batch_size=batch_size, mode=mode,
                               read=Reading(seed=0, num_epochs=None, shard_index=0,
                                            shard_count=1))
    secs, masks = common.timed(
        lambda: [b["attention_mask"] for b in itertools.islice(iter(ds), count)])
    real, slots = sum(int(m.sum()) for m in masks), sum(m.size for m in masks)
    rows.append({"mode": mode, "rows": slots // seq_len, "fill": real / slots,
                 "seconds": secs, "real_tokens_per_s": real / secs})
  return rows


def make_step(cfg, example, max_predictions):
  task = registry.make_task("mlm", cfg, max_predictions=max_predictions)
  params = nn.meta.unbox(jax.jit(lambda k: task.model.init(k, *task.example_batch(example)))(
      jax.random.key(0))["params"])
  ocfg = optim.default_optim_config()
  ocfg.update(schedule="constant")
  tx, _ = optim.make_optimizer(ocfg, params, num_layers=cfg.num_layers)
  state = steps.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                           jnp.full((), -1, jnp.int32))
  step = functools.partial(steps.train_step, task=task, tx=tx, base_rng=jax.random.key(1))
  return jax.jit(step, donate_argnums=0).lower(state, example).compile(), state


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data-dir", default="data")
  parser.add_argument("--preset", default="small")
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--steps", type=int, default=6, help="timed steps per mode")
  parser.add_argument("--max-predictions", type=int, default=None,
                      help="M gathered per row; default ceil(0.2 * L) (15%% of full rows + slack)")
  parser.add_argument("--compare-packing", action="store_true",
                      help="pipeline only: fill and tokens/s of pack vs best_fit")
  parser.add_argument("--batches", type=int, default=40,
                      help="batches per mode (--compare-packing)")
  args = parser.parse_args()
  tok = Tokenizer.from_file(default_tokenizer_path())
  if args.compare_packing:
    rows = compare_packing(args.data_dir, tok, args.seq_len, args.batch, args.batches)
    common.print_json({"benchmark": "packing_modes", "date": time.strftime("%Y-%m-%d"),
                       "machine": common.machine_info(), "load": os.getloadavg(),
                       "seq_len": args.seq_len, "batch": args.batch, "results": rows})
    common.print_table(rows, ["mode", "rows", "fill", "seconds", "real_tokens_per_s"])
    return
  source = builders.shakespeare_source(args.data_dir)
  data = {m: batches(source, tok, m, args.seq_len, args.batch, args.steps + 1)
          for m in ("pad", "pack")}
  cfg = EncoderConfig.preset(args.preset, vocab_size=tok.vocab_size, max_len=args.seq_len)
  m = args.max_predictions or -(-args.seq_len // 5)
  compiled, state = make_step(cfg, data["pad"][0], m)
  times = {"pad": [], "pack": []}
  stats = {k: {"real": 0, "slots": 0, "predicted": 0.0, "dropped": 0.0} for k in times}
  state, _ = compiled(state, data["pad"][0])  # warm-up
  for i in range(1, args.steps + 1):
    for mode in ("pad", "pack"):
      b = data[mode][i]
      secs, (state, sums) = common.timed(lambda: common.block(compiled(state, b)))
      times[mode].append(secs)
      s = stats[mode]
      s["real"] += int(np.asarray(b["attention_mask"]).sum())
      s["slots"] += b["attention_mask"].size
      s["predicted"] += float(sums["loss_weight"])
      s["dropped"] += float(sums["dropped"])
  rows = []
  for mode in ("pad", "pack"):
    s, step_s = stats[mode], common.median(times[mode])
    real_per_step = s["real"] / args.steps
    rows.append({"mode": mode, "step_s": step_s, "real_tokens_per_step": real_per_step,
                 "fill": s["real"] / s["slots"], "real_tokens_per_s": real_per_step / step_s,
                 "slots_per_s": args.batch * args.seq_len / step_s,
                 "dropped_predictions": s["dropped"] / max(s["dropped"] + s["predicted"], 1)})
  ratio = rows[1]["real_tokens_per_s"] / rows[0]["real_tokens_per_s"]
  rows[1]["x_vs_pad"] = ratio
  common.print_json({"benchmark": "packing", "date": time.strftime("%Y-%m-%d"),
                     "machine": common.machine_info(), "preset": args.preset,
                     "seq_len": args.seq_len, "batch": args.batch, "max_predictions": m,
                     "steps": args.steps, "results": rows})
  common.print_table(rows, ["mode", "step_s", "real_tokens_per_step", "fill",
                            "real_tokens_per_s", "slots_per_s", "x_vs_pad",
                            "dropped_predictions"])


if __name__ == "__main__":
  main()
