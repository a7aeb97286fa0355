"""One attention layer (projections + attention), forward + backward, vs sequence length.

  .venv/bin/python bench/attention.py [--lengths 128,256,512,1024,2048,4096 --dim 512 --heads 8]

Implementations: `xla` (einsum, L x L logits), `fused` (jax.nn.dot_product_attention;
on CPU this is XLA's own composite, not a flash kernel), `linear` (elu+1 features,
O(L)) and `sliding` (`xla` with sliding_window=W: a mask, so still O(L^2) work).
The timed function builds the mask too, as the encoder does. Memory is XLA's
compiled temp buffer size (deterministic, unaffected by other load); times are
medians with the implementations alternated per repeat.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from jaxencoder import EncoderConfig  # noqa: E402
from jaxencoder.model.attention import AttentionInputs, MultiHeadAttention  # noqa: E402
from jaxencoder.model.flash import plan_attention  # noqa: E402
from jaxencoder.model.masks import make_attention_mask  # noqa: E402

IMPLS = ("xla", "fused", "linear", "sliding")


def layer_step(impl: str, seq_len: int, dim: int, heads: int, window: int, batch: int):
  """(jitted compiled fwd+bwd, args, temp bytes, compile seconds) of one attention layer."""
  cfg = EncoderConfig(num_layers=1, emb_dim=dim, num_heads=heads, max_len=seq_len,
                      attention_impl="xla" if impl == "sliding" else impl,
                      sliding_window=window if impl == "sliding" else None,
                      position_embedding="none", dropout_rate=0.0, attention_dropout_rate=0.0)
  mha = MultiHeadAttention(cfg)
  plan = plan_attention(cfg)
  x_BxLxD = jax.random.normal(jax.random.key(0), (batch, seq_len, dim), jnp.float32)
  key_mask_BxL = jnp.ones((batch, seq_len), jnp.int32)

  def apply(params, x, key_mask):
    mask = None if impl == "linear" else make_attention_mask(
        key_mask, sliding_window=cfg.sliding_window)
    inputs = AttentionInputs(mask, None, key_mask, None, None, plan)
    out, _ = mha.apply({"params": params}, x, inputs, deterministic=True)
    return jnp.sum(out ** 2)

  inputs = AttentionInputs(None, None, key_mask_BxL, None, None, plan)
  params = nn.meta.unbox(mha.init(jax.random.key(1), x_BxLxD, inputs, deterministic=True)["params"])
  grad = jax.jit(jax.value_and_grad(apply, argnums=(0, 1)))
  args = (params, x_BxLxD, key_mask_BxL)
  start = time.perf_counter()
  compiled = grad.lower(*args).compile()
  compile_s = time.perf_counter() - start
  mem = compiled.memory_analysis()
  temp = getattr(mem, "temp_size_in_bytes", -1) if mem is not None else -1
  return compiled, args, temp, compile_s


def attention_flops(impl: str, batch: int, seq_len: int, dim: int, heads: int) -> float:
  """fwd+bwd matmul FLOPs: projections 4 * 2*L*D^2, attention 2 * 2*L^2*D (linear: 4*L*D*K)."""
  proj = 4 * 2 * seq_len * dim * dim
  if impl == "linear":
    attn = 2 * 2 * seq_len * dim * (dim // heads)  # a K x K state per head
  else:
    attn = 2 * 2 * seq_len * seq_len * dim  # the mask does not skip work
  return 3.0 * batch * (proj + attn)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--lengths", default="128,256,512,1024,2048,4096")
  parser.add_argument("--impls", default=",".join(IMPLS))
  parser.add_argument("--dim", type=int, default=512)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--window", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  rows = []
  for seq_len in map(int, args.lengths.split(",")):
    impls = args.impls.split(",")
    built = {i: layer_step(i, seq_len, args.dim, args.heads, args.window, args.batch)
             for i in impls}
    times = {i: [] for i in impls}
    for fn, a, _, _ in built.values():
      common.block(fn(*a))  # warm-up
    for _ in range(args.repeats):
      for i in impls:
        fn, a, _, _ = built[i]
        times[i].append(common.timed(lambda: common.block(fn(*a)))[0])
    for i in impls:
      _, _, temp, compile_s = built[i]
      step_s = common.median(times[i])
      rows.append({"impl": i, "seq_len": seq_len, "step_ms": 1e3 * step_s,
                   "tokens_per_s": args.batch * seq_len / step_s,
                   "temp_mib": temp / 2 ** 20, "compile_s": compile_s,
                   "gflop_per_s": attention_flops(i, args.batch, seq_len, args.dim,
                                                  args.heads) / step_s / 1e9})
    del built
    print(f"# done L={seq_len}", file=sys.stderr, flush=True)
  for r in rows:
    xla = [x for x in rows if x["seq_len"] == r["seq_len"] and x["impl"] == "xla"]
    r["speedup_vs_xla"] = xla[0]["step_ms"] / r["step_ms"] if xla else None
  common.print_json({"benchmark": "attention", "date": time.strftime("%Y-%m-%d"),
                     "machine": common.machine_info(), "dim": args.dim, "heads": args.heads,
                     "batch": args.batch, "window": args.window, "results": rows})
  common.print_table(rows, ["impl", "seq_len", "step_ms", "speedup_vs_xla", "tokens_per_s",
                            "gflop_per_s", "temp_mib", "compile_s"])


if __name__ == "__main__":
  main()
