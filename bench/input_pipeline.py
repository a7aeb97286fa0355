"""Input-pipeline throughput on the Shakespeare corpus: padded vs packed MLM batches.

  python -m jaxencoder.data fetch shakespeare --data-dir /tmp/jaxencoder_data
  python bench/input_pipeline.py --data-dir /tmp/jaxencoder_data [--seq-len 128 --batch-size 32]

Prints one JSON line, then a table. Tokens/s counts real (non-padding) tokens.
"""

import argparse
import json
import time

from jaxencoder.data.__main__ import shakespeare_source
from jaxencoder.tokenizer import default_tokenizer_path
from jaxencoder.data import pipeline
from jaxencoder.tokenizer import Tokenizer


def run(source, tok, mode, seq_len, batch_size, max_batches):
  ds = pipeline.mlm_pipeline(source, tok, seq_len=seq_len, batch_size=batch_size, mode=mode,
                             seed=0, num_epochs=None, shard_index=0, shard_count=1)
  it = iter(ds)
  next(it)  # warm-up
  real = slots = 0
  start = time.perf_counter()
  for _ in range(max_batches):
    mask = next(it)["attention_mask"]
    real, slots = real + int(mask.sum()), slots + mask.size
  secs = time.perf_counter() - start
  return {"mode": mode, "batches": max_batches, "seconds": round(secs, 3),
          "real_tokens_per_s": round(real / secs), "slots_per_s": round(slots / secs),
          "batches_per_s": round(max_batches / secs, 2), "efficiency": round(real / slots, 4)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--data-dir", required=True)
  parser.add_argument("--tokenizer", default=None)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--batches", type=int, default=100)
  args = parser.parse_args()
  tok = Tokenizer.from_file(args.tokenizer or default_tokenizer_path())
  source = shakespeare_source(args.data_dir)
  results = [run(source, tok, m, args.seq_len, args.batch_size, args.batches)
             for m in ("pad", "pack")]
  print(json.dumps({"seq_len": args.seq_len, "batch_size": args.batch_size,
                    "examples": len(source), "results": results}))
  print(f"{'mode':<6}{'batches/s':>11}{'real tok/s':>12}{'slots/s':>10}{'efficiency':>12}")
  for r in results:
    print(f"{r['mode']:<6}{r['batches_per_s']:>11}{r['real_tokens_per_s']:>12}"
          f"{r['slots_per_s']:>10}{r['efficiency']:>12}")


if __name__ == "__main__":
  main()
