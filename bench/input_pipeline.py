"""Input-pipeline throughput on the Shakespeare corpus: MLM batches, padded and packed,
with token ids stored at prepare ("stored") or made at read time ("tokenise"), made by
0, 1, 2, ... grain worker processes.

  python -m jaxencoder.data fetch shakespeare --data-dir data
  python bench/input_pipeline.py --data-dir data [--workers 0,1,2 --batches 200]

Tokens/s counts real (non-padding) tokens. "per core" divides by the processes making
batches (workers, or 1 for 0 workers: the caller); scaling is tokens/s over workers x
the 1-worker tokens/s of the same mode. Prints one JSON line, then a table.
"""

import argparse
import json
import os
import time

from common import real_token_rate
from jaxencoder.data import builders, pipeline, sources
from jaxencoder.data.pipeline import Reading
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path


def run(source, tok, ids, mode, workers, seq_len, batch_size, batches, warmup):
  ds = pipeline.mlm_pipeline(source, tok, seq_len=seq_len, batch_size=batch_size, mode=mode,
                             read=Reading(seed=0, num_epochs=None, shard_index=0, shard_count=1,
                                          workers=workers),
                             text=pipeline.TextInput(stored_ids=ids == "stored"))
  it = iter(ds)
  start = time.perf_counter()
  for _ in range(warmup):  # worker start-up (spawned processes import jax) and queues
    next(it)
  ready = time.perf_counter() - start
  rate = real_token_rate(it, batches)
  if hasattr(it, "close"):
    it.close()
  return {"mode": mode, "workers": workers, "batches": batches,
          "seconds": round(rate["seconds"], 3), "startup_s": round(ready, 2),
          "real_tokens_per_s": rate["real_tokens_per_s"],
          "per_core": round(rate["real_tokens_per_s"] / max(workers, 1)),
          "efficiency": rate["efficiency"]}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--data-dir", required=True)
  parser.add_argument("--tokenizer", default=None)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--batches", type=int, default=200)
  parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts")
  parser.add_argument("--ids", default="stored,tokenise", help="stored, tokenise or both")
  args = parser.parse_args()
  tok_path = args.tokenizer or str(default_tokenizer_path())
  tok = Tokenizer.from_file(tok_path)
  source = sources.open_source(str(builders.prepare_fetched(
      "shakespeare", args.data_dir, tokenizer=tok_path)))
  results = []
  for ids in args.ids.split(","):
    for mode in ("pad", "pack"):
      for workers in map(int, args.workers.split(",")):
        row = run(source, tok, ids, mode, workers, args.seq_len, args.batch_size,
                  args.batches, warmup=max(10, 4 * workers))
        results.append({"ids": ids, **row})
  for r in results:
    one = next((o for o in results if (o["ids"], o["mode"], o["workers"]) ==
                (r["ids"], r["mode"], 1)), None)
    r["scaling"] = (round(r["real_tokens_per_s"] / (r["workers"] * one["real_tokens_per_s"]), 3)
                    if one and r["workers"] > 0 else None)
  print(json.dumps({"seq_len": args.seq_len, "batch_size": args.batch_size,
                    "cores": os.cpu_count(), "examples": len(source),
                    "results": results}))
  print(f"{'ids':<9}{'mode':<6}{'workers':>8}{'real tok/s':>12}{'per core':>10}{'scaling':>9}"
        f"{'efficiency':>12}{'startup s':>11}")
  for r in results:
    print(f"{r['ids']:<9}{r['mode']:<6}{r['workers']:>8}{r['real_tokens_per_s']:>12}"
          f"{r['per_core']:>10}{r['scaling'] if r['scaling'] is not None else '-':>9}"
          f"{r['efficiency']:>12}{r['startup_s']:>11}")


if __name__ == "__main__":
  main()
