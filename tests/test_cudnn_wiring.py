"""The cuDNN wiring inside the encoder, checked on CPU (issue 29).

`attention_impl="auto"` runs `cudnn` on GPU, where the encoder hands cuDNN padding as key
lengths, packed rows as a [B, 1, L, L] mask, causal and causal windows as cuDNN's own
mask types, and the sparse last block as gathered query rows. None of that runs on CPU
by itself: here the whole Encoder (forward and gradient) runs the `cudnn` plan with the
same `jax.nn.dot_product_attention` call under XLA's implementation, against the `xla`
einsum reference with the same params. Test-only: nothing here is a production knob.

- `flash.target_backend` says "gpu" (so plan_attention picks and keeps `cudnn`);
- the cudnn table entry keeps its limits except float32 (cuDNN's flash kernel needs
  bf16 / fp16, but float32 lets the comparison be tight);
- `jax.nn.dot_product_attention` is wrapped: a call asking for implementation="cudnn"
  runs implementation="xla" instead, and is recorded with its arguments, so a test
  cannot pass by silently falling back to `xla`, and the arguments are held to what
  cuDNN accepts (XLA's implementation takes some that cuDNN refuses).
The real kernel is checked by tests/test_flash.py::test_cudnn_matches_xla_on_gpu.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder import Encoder
from jaxencoder.model import flash

B, L = 3, 12
LENGTHS = (12, 7, 3)  # right padding, a different length per row
MASK_BxL = (jnp.arange(L)[None, :] < jnp.array(LENGTHS)[:, None]).astype(jnp.int32)
SEGMENTS_BxL = jnp.array([[1] * 5 + [2] * 4 + [3] * 3,
                          [1] * 3 + [2] * 6 + [0] * 3,
                          [1] * 1 + [2] * 7 + [3] * 2 + [0] * 2], jnp.int32)
# The sparse last block: MLM's masked positions ([CLS] at 0 is added by the encoder).
OUTPUT_POSITIONS_BxM = jnp.array([[2, 5, 11], [1, 3, 6], [0, 1, 2]], jnp.int32)
# XLA CPU options that cut this file's compile time about 4x (runtime is negligible here).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@pytest.fixture
def cudnn_calls(monkeypatch):
  """Makes the cudnn plan run on CPU (see the module docstring); returns the list of the
  `jax.nn.dot_product_attention(implementation="cudnn")` calls traced, one dict each."""
  monkeypatch.setattr(flash, "target_backend", lambda: "gpu")
  monkeypatch.setattr(flash, "max_cudnn_head_dim", lambda: 256)
  real = flash.IMPLEMENTATIONS["cudnn"]
  monkeypatch.setitem(flash.IMPLEMENTATIONS, "cudnn", dataclasses.replace(
      real, check=lambda cfg, backend, window: real.check(cfg.replace(dtype="bfloat16"), backend,
                                                          window)))
  calls, dot_product_attention = [], jax.nn.dot_product_attention

  def on_xla(query, key, value, *args, implementation=None, **kwargs):
    if implementation == "cudnn":
      calls.append(dict(q_len=query.shape[1], kv_len=key.shape[1],
                        is_causal=kwargs.get("is_causal", False),
                        window=kwargs.get("local_window_size"),
                        lengths=kwargs.get("key_value_seq_lengths") is not None,
                        mask=kwargs.get("mask") is not None,
                        bias=kwargs.get("bias") is not None))
      implementation = "xla"
    return dot_product_attention(query, key, value, *args, implementation=implementation,
                                 **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", on_xla)
  return calls


def _random_params(cfg, ids):
  """Params of the encoder's layout, drawn in numpy (a jitted init compiles for longer
  than the test runs); every leaf random, norms and biases included."""
  shapes = jax.eval_shape(Encoder(cfg).init, jax.random.key(0), ids)
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), shapes)


def _both(cfg, params, ids, call, rows_BxL):
  """(xla, cudnn plan): each the real rows of last_hidden_state, pooled, and
  d(loss)/d(params), from one program: one compile, with FAST_COMPILE (compiling
  dominates this file's time; both sides get the same options)."""
  def outputs_and_grads(impl):
    def loss(params):
      out = Encoder(cfg.replace(attention_impl=impl)).apply(params, ids, **call)
      real = out.last_hidden_state * rows_BxL[..., None]
      return jnp.sum(jnp.sin(real)) + jnp.sum(jnp.sin(out.pooled)), (real, out.pooled)
    (_, (real, pooled)), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return real, pooled, grads

  lowered = jax.jit(lambda p: (outputs_and_grads("xla"), outputs_and_grads("auto"))).lower(
      params)
  try:
    compiled = lowered.compile(compiler_options=FAST_COMPILE)
  except Exception as e:  # an XLA without these options: compile as usual
    if "No such compile option" not in str(e):
      raise
    compiled = lowered.compile()
  return compiled(params)


def _assert_close(actual, desired, what):
  """rtol 1e-5, atol 1e-5 of the array's own scale (gradients reach ~1e2 here)."""
  scale = max(1.0, float(np.max(np.abs(desired))))
  np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


CASES = {  # name: (config overrides, what the call passes)
    "padding": (dict(), dict(attention_mask=MASK_BxL)),
    "packed": (dict(), dict(segment_ids=SEGMENTS_BxL)),
    "causal": (dict(causal=True), dict(attention_mask=MASK_BxL)),
    "causal-window": (dict(causal=True, sliding_window=2), dict(attention_mask=MASK_BxL)),
    "packed-causal-window": (dict(causal=True, sliding_window=2),
                             dict(segment_ids=SEGMENTS_BxL)),
    "sparse-last": (dict(position_embedding="rope"),
                    dict(attention_mask=MASK_BxL, output_positions=OUTPUT_POSITIONS_BxM)),
    "sparse-last-packed": (dict(position_embedding="rope"),
                           dict(segment_ids=SEGMENTS_BxL,
                                output_positions=OUTPUT_POSITIONS_BxM)),
    # A causal mask on gathered query rows is no cuDNN mask type: the last layer runs xla.
    "sparse-last-causal-falls-back": (dict(causal=True, position_embedding="rope"),
                                      dict(attention_mask=MASK_BxL,
                                           output_positions=OUTPUT_POSITIONS_BxM)),
    "scan": (dict(scan_layers=True), dict(attention_mask=MASK_BxL)),
    "scan-causal-window": (dict(scan_layers=True, causal=True, sliding_window=3),
                           dict(attention_mask=MASK_BxL)),
    "scan-sparse-last": (dict(scan_layers=True, position_embedding="rope"),
                         dict(attention_mask=MASK_BxL, output_positions=OUTPUT_POSITIONS_BxM)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cudnn_plan_in_the_encoder_matches_xla(name, cudnn_calls):
  overrides, call = CASES[name]
  cfg = tiny_config(pooling="cls", **overrides)
  ids = random_ids(11, (B, L))
  packed = "segment_ids" in call
  keys_BxL = (SEGMENTS_BxL > 0).astype(jnp.int32) if packed else MASK_BxL
  sparse = "output_positions" in call
  rows_BxL = jnp.ones((B, OUTPUT_POSITIONS_BxM.shape[1]), jnp.int32) if sparse else keys_BxL

  params = _random_params(cfg.replace(attention_impl="xla"), ids)
  (ref, ref_pooled, ref_grads), (out, pooled, grads) = _both(cfg, params, ids, call, rows_BxL)
  _assert_close(out, ref, "last_hidden_state")
  _assert_close(pooled, ref_pooled, "pooled")
  flat = jax.tree_util.tree_leaves_with_path(grads)
  for (path, g), r in zip(flat, jax.tree.leaves(ref_grads)):
    _assert_close(g, r, "grad " + jax.tree_util.keystr(path))

  # The cuDNN path really ran (so this did not pass by falling back to xla), in every
  # layer it can serve, with the wiring the case needs: lengths, or the packed rows' mask.
  # A causal mask on the sparse last block's gathered rows is no cuDNN mask type: that
  # layer alone runs xla (the plan is made per layer), the ones before it keep cuDNN.
  falls_back = sparse and cfg.causal
  plan = flash.plan_attention(cfg.replace(attention_impl="cudnn"), sparse_queries=sparse)
  assert plan.impl == ("xla" if falls_back else "cudnn"), plan
  assert len(cudnn_calls) >= cfg.num_layers - falls_back, cudnn_calls
  # What cuDNN itself accepts: padding as lengths (packed rows: the mask instead), its
  # causal mask type, and windows left-only (jax raises on a right window when padding).
  window = None if cfg.sliding_window is None else (cfg.sliding_window, 0)
  expected = dict(is_causal=cfg.causal, window=window, lengths=not packed, mask=packed,
                  bias=False)
  for c in cudnn_calls:
    assert {k: c[k] for k in expected} == expected, c
  q_lens = {c["q_len"] for c in cudnn_calls}
  gathered = sparse and not falls_back
  assert q_lens == ({L, 1 + OUTPUT_POSITIONS_BxM.shape[1]} if gathered else {L}), q_lens
