"""Interventions inside the forward pass (`Encoder(..., interventions=...)`): patching a
layer's output or a head's output from another run, affine erasure, zero-ablation; the
same in the looped stack, the scanned one and the scan by period of global / local layers,
and with the flash kernels."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder import EncoderForMaskedLM, loop_to_scan
from jaxencoder.model.encoder import Encoder, layer_name
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.model.interventions import Interventions

B, L, N, H, K, D = 2, 12, 3, 4, 8, 32
IDS = random_ids(0, (B, L))
CORRUPT = random_ids(7, (B, L))
MASK = jnp.array([[1] * L, [1] * 8 + [0] * (L - 8)])


def config(**overrides):
  return tiny_config(num_layers=N, **overrides)


def rope(**overrides):
  """Positions reach only attention (no position embedding is added to x)."""
  return config(position_embedding="rope", **overrides)


def modern(**overrides):
  """Global / local layers (period 2: under scan, one group of 2 layers, then layer 2)."""
  return config(position_embedding="rope", global_attention_every=2, sliding_window=3,
                norm_position="pre", **overrides)


def init(cfg):
  """Looped-layout params of `cfg`'s model."""
  return nn.meta.unbox(Encoder(cfg.replace(scan_layers=False)).init(
      jax.random.key(1), IDS, MASK))["params"]


def run(cfg, params, ids=IDS, **kw):
  """The encoder's output; `params` in the looped layout, converted when cfg scans."""
  params = loop_to_scan(params) if cfg.scan_layers else params
  return Encoder(cfg).apply({"params": params}, ids, MASK, **kw)


def layers_where(layers, positions=slice(None)):
  where = np.zeros((N, B, L), np.float32)
  where[layers, :, positions] = 1.0
  return where


def stacked(arrays):
  return jnp.stack(arrays)


def assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


# ------------------------------------------------------------------------- layer patches
@pytest.mark.parametrize("scan", [False, True])
def test_patching_layers_with_their_own_outputs_changes_nothing_bit_exactly(scan):
  cfg = config(scan_layers=scan)
  params = init(cfg)
  plain = run(cfg, params, output_hidden_states=True)
  for where in (layers_where(slice(None)), layers_where([0], slice(2, 7))):
    patched = run(cfg, params, output_hidden_states=True, interventions=Interventions.patch_layers(
        where, stacked(plain.hidden_states[1:])))
    assert_same(patched, plain)


@pytest.mark.parametrize("layer", [0, N - 1])
@pytest.mark.parametrize("scan", [False, True])
def test_patching_every_position_of_a_layer_from_the_clean_run_gives_the_clean_output(
    scan, layer):
  cfg = config(scan_layers=scan)
  params = init(cfg)
  clean = run(cfg, params, output_hidden_states=True)
  corrupted = run(cfg, params, CORRUPT, output_hidden_states=True)
  assert not np.allclose(corrupted.pooled, clean.pooled, atol=1e-3)
  patched = run(cfg, params, CORRUPT, output_hidden_states=True,
                interventions=Interventions.patch_layers(layers_where(layer),
                                                         stacked(clean.hidden_states[1:])))
  np.testing.assert_array_equal(patched.last_hidden_state, clean.last_hidden_state)
  np.testing.assert_array_equal(patched.pooled, clean.pooled)
  for k in range(layer + 1):  # before the patch: the corrupted run's own states
    np.testing.assert_array_equal(patched.hidden_states[k], corrupted.hidden_states[k])


def test_patching_the_layer_before_a_pre_norm_models_last_gives_the_clean_output():
  """A pre-norm model's hidden_states[N] is after the final norm: patch layer N - 2."""
  cfg = modern()
  params = init(cfg)
  clean = run(cfg, params, output_hidden_states=True)
  patched = run(cfg, params, CORRUPT, interventions=Interventions.patch_layers(
      layers_where(N - 2), stacked(clean.hidden_states[1:])))
  np.testing.assert_allclose(patched.last_hidden_state, clean.last_hidden_state, atol=1e-6)
  np.testing.assert_allclose(patched.pooled, clean.pooled, atol=1e-6)


@pytest.mark.parametrize("scan", [False, True])
def test_patching_a_pre_norm_models_last_layer_from_the_clean_run_gives_the_clean_output(scan):
  """Its last layer's patch acts after the final norm, on hidden_states[N]."""
  cfg = modern(scan_layers=scan)
  params = init(cfg)
  clean = run(cfg, params, output_hidden_states=True)
  corrupted = run(cfg, params, CORRUPT, output_hidden_states=True)
  assert not np.allclose(corrupted.pooled, clean.pooled, atol=1e-3)
  patched = run(cfg, params, CORRUPT, output_hidden_states=True,
                interventions=Interventions.patch_layers(layers_where(N - 1),
                                                         stacked(clean.hidden_states[1:])))
  np.testing.assert_array_equal(patched.last_hidden_state, clean.last_hidden_state)
  np.testing.assert_array_equal(patched.hidden_states[N], clean.hidden_states[N])
  np.testing.assert_array_equal(patched.pooled, clean.pooled)
  for k in range(N):
    np.testing.assert_array_equal(patched.hidden_states[k], corrupted.hidden_states[k])


@pytest.mark.parametrize("scan", [False, True])
def test_patching_a_pre_norm_models_layers_with_their_own_outputs_changes_nothing(scan):
  cfg = modern(scan_layers=scan)
  params = init(cfg)
  plain = run(cfg, params, output_hidden_states=True)
  patched = run(cfg, params, output_hidden_states=True, interventions=Interventions.patch_layers(
      layers_where(slice(None)), stacked(plain.hidden_states[1:])))
  assert_same(patched, plain)


def test_a_pre_norm_models_last_layer_keeps_its_head_edits_in_the_block():
  """Only the stream edits move after the final norm: zeroing a head of the last layer
  still equals head_mask 0 for it."""
  cfg = modern()
  params = init(cfg)
  head_mask = np.ones((N, H), np.float32)
  head_mask[N - 1, 2] = 0.0
  edits = Interventions.zero_heads(heads_where(N - 1, 2)).combine(
      Interventions.zero_layers(layers_where(N - 1, slice(0, 3))))
  zeroed = run(cfg, params, output_hidden_states=True, interventions=edits)
  masked = run(cfg, params, output_hidden_states=True, head_mask=head_mask)
  np.testing.assert_array_equal(np.asarray(zeroed.hidden_states[N])[:, :3], 0.0)
  np.testing.assert_allclose(np.asarray(zeroed.hidden_states[N])[:, 3:],
                             np.asarray(masked.hidden_states[N])[:, 3:], atol=1e-6)


def test_without_stream_turns_off_one_layers_patches_and_erasure_only():
  where = layers_where(slice(None))
  edits = Interventions.zero_layers(where).combine(
      Interventions.erase(N - 1, np.eye(D), np.zeros(D), N)).combine(
      Interventions.zero_heads(heads_where(N - 1, 0)))
  off = edits.without_stream(N - 1)
  np.testing.assert_array_equal(off.layer_where_NxBxL[:N - 1], where[:N - 1])
  np.testing.assert_array_equal(off.layer_where_NxBxL[N - 1], 0.0)
  np.testing.assert_array_equal(off.layer_erase_N, 0.0)
  assert off.head_where_NxBxLxH is edits.head_where_NxBxLxH
  assert Interventions().without_stream(0) == Interventions()


def test_zeroing_and_mean_ablating_replace_the_marked_positions():
  cfg = config()
  params = init(cfg)
  where = layers_where([1], slice(3, 5))
  zeroed = run(cfg, params, output_hidden_states=True,
               interventions=Interventions.zero_layers(where))
  np.testing.assert_array_equal(np.asarray(zeroed.hidden_states[2])[:, 3:5], 0.0)
  mean_NxD = np.arange(N * D, dtype=np.float32).reshape(N, D)
  ablated = run(cfg, params, output_hidden_states=True,
                interventions=Interventions.mean_ablate_layers(where, mean_NxD))
  np.testing.assert_array_equal(np.asarray(ablated.hidden_states[2])[:, 3:5],
                                np.broadcast_to(mean_NxD[1], (B, 2, D)))
  plain = run(cfg, params, output_hidden_states=True)
  np.testing.assert_array_equal(np.asarray(ablated.hidden_states[2])[:, :3],
                                np.asarray(plain.hidden_states[2])[:, :3])


# ------------------------------------------------------------------------------- erasure
@pytest.mark.parametrize("scan", [False, True])
def test_erasing_with_the_identity_changes_nothing(scan):
  cfg = config(scan_layers=scan)
  params = init(cfg)
  plain = run(cfg, params, output_hidden_states=True)
  erased = run(cfg, params, output_hidden_states=True,
               interventions=Interventions.erase(1, np.eye(D), np.zeros(D), N))
  assert_same(erased, plain)


def projection(seed=0):
  """(P = I - U U^T for 3 orthonormal random directions U, a bias orthogonal to them, U)."""
  rng = np.random.default_rng(seed)
  u_Dx3, _ = np.linalg.qr(rng.normal(size=(D, 3)))
  p_DxD = np.eye(D) - u_Dx3 @ u_Dx3.T
  return p_DxD, p_DxD @ rng.normal(size=D), u_Dx3


@pytest.mark.parametrize("layer", [0, 1, N - 1])
@pytest.mark.parametrize("scan", [False, True])
def test_erasing_at_layer_k_projects_its_output_and_leaves_earlier_layers(scan, layer):
  cfg = config(scan_layers=scan)
  params = init(cfg)
  p_DxD, bias_D, u_Dx3 = projection()
  plain = run(cfg, params, output_hidden_states=True)
  erased = run(cfg, params, output_hidden_states=True,
               interventions=Interventions.erase(layer, p_DxD, bias_D, N))
  for k in range(layer + 1):
    np.testing.assert_array_equal(erased.hidden_states[k], plain.hidden_states[k])
  want = np.asarray(plain.hidden_states[layer + 1], np.float64) @ p_DxD + bias_D
  np.testing.assert_allclose(erased.hidden_states[layer + 1], want, atol=1e-6)
  np.testing.assert_allclose(np.asarray(erased.hidden_states[layer + 1]) @ u_Dx3, 0.0,
                             atol=1e-5)
  if layer < N - 1:
    assert not np.allclose(erased.last_hidden_state, plain.last_hidden_state, atol=1e-3)


@pytest.mark.parametrize("scan", [False, True])
def test_erasing_a_pre_norm_models_last_layer_projects_hidden_states_n(scan):
  """Read after the final norm and erased there: what amnesic probing fits its eraser on."""
  cfg = modern(scan_layers=scan)
  params = init(cfg)
  p_DxD, bias_D, u_Dx3 = projection()
  plain = run(cfg, params, output_hidden_states=True)
  erased = run(cfg, params, output_hidden_states=True,
               interventions=Interventions.erase(N - 1, p_DxD, bias_D, N))
  for k in range(N):
    np.testing.assert_array_equal(erased.hidden_states[k], plain.hidden_states[k])
  want = np.asarray(plain.hidden_states[N], np.float64) @ p_DxD + bias_D
  np.testing.assert_allclose(erased.hidden_states[N], want, atol=1e-6)
  np.testing.assert_allclose(erased.last_hidden_state, want, atol=1e-6)
  np.testing.assert_allclose(np.asarray(erased.hidden_states[N]) @ u_Dx3, 0.0, atol=1e-5)


# --------------------------------------------------------------------------------- heads
def heads_where(layer, head):
  where = np.zeros((N, B, L, H), np.float32)
  where[layer, ..., head] = 1.0
  return where


@pytest.mark.parametrize("impl,scan", [("xla", False), ("xla", True), ("splash", True),
                                       ("linear", False)])
def test_zeroing_a_head_equals_head_mask_0_for_it(impl, scan):
  cfg = config(scan_layers=scan, attention_impl=impl)
  params = init(cfg)
  head_mask = np.ones((N, H), np.float32)
  head_mask[1, 2] = 0.0
  masked = run(cfg, params, head_mask=head_mask, output_hidden_states=True)
  zeroed = run(cfg, params, interventions=Interventions.zero_heads(heads_where(1, 2)),
               output_hidden_states=True)
  np.testing.assert_allclose(zeroed.last_hidden_state, masked.last_hidden_state, atol=1e-6)
  np.testing.assert_array_equal(zeroed.hidden_states[1], masked.hidden_states[1])


def test_head_outputs_are_the_attention_weights_times_the_values():
  """Layer 0's per-head outputs against numpy: probs @ (x W_v + b_v), head by head."""
  cfg = config()
  params = init(cfg)
  out = run(cfg, params, output_hidden_states=True, output_attentions=True,
            output_head_outputs=True)
  assert len(out.head_outputs) == N and out.head_outputs[0].shape == (B, L, H, K)
  value = params[layer_name(0)]["attention"]["value"]
  x_BxLxD = np.asarray(out.hidden_states[0], np.float64)
  v_BxLxHxK = np.einsum("bld,dhk->blhk", x_BxLxD, value["kernel"]) + np.asarray(value["bias"])
  want = np.einsum("bhqs,bshk->bqhk", np.asarray(out.attentions[0], np.float64), v_BxLxHxK)
  np.testing.assert_allclose(out.head_outputs[0], want, atol=1e-5)


@pytest.mark.parametrize("impl", ["splash", "fused"])
def test_every_kernel_returns_the_same_head_outputs(impl):
  cfg = config()
  params = init(cfg)
  ref = run(cfg, params, output_head_outputs=True).head_outputs
  got = run(cfg.replace(attention_impl=impl), params, output_head_outputs=True).head_outputs
  real = np.asarray(MASK, bool)[..., None, None]
  for a, b in zip(got, ref):
    np.testing.assert_allclose(np.where(real, a, 0), np.where(real, b, 0), atol=2e-5)


def sharp(params, scale=8.0):
  """`params` with every query kernel scaled: peaked attention, which positions move."""
  return {name: {**p, "attention": {**p["attention"], "query": jax.tree.map(
      lambda x: x * scale, p["attention"]["query"])}} if name.startswith("layers_") else p
          for name, p in params.items()}


@pytest.mark.parametrize("scan", [False, True])
def test_patching_every_head_from_a_run_with_the_same_residual_gives_its_layer_output(scan):
  """Other positions (RoPE: they reach attention only) change every head's output, not the
  embeddings; patch the clean heads of layer 0 in and layer 0's output is the clean one."""
  cfg = rope(scan_layers=scan)
  params = sharp(init(cfg))
  shifted_BxL = jnp.broadcast_to(jnp.arange(L)[::-1], (B, L))
  clean = run(cfg, params, output_hidden_states=True, output_head_outputs=True)
  other = run(cfg, params, positions=shifted_BxL, output_hidden_states=True)
  assert np.abs(other.hidden_states[1] - clean.hidden_states[1]).max() > 1e-4
  heads_NxBxLxHxK = stacked(clean.head_outputs)
  patch = lambda layers: Interventions.patch_heads(
      np.broadcast_to(layers_where(layers)[..., None], (N, B, L, H)), heads_NxBxLxHxK)
  first = run(cfg, params, positions=shifted_BxL, output_hidden_states=True,
              interventions=patch([0]))
  np.testing.assert_allclose(first.hidden_states[1], clean.hidden_states[1], atol=1e-6)
  assert np.abs(first.hidden_states[2] - clean.hidden_states[2]).max() > 1e-4
  every = run(cfg, params, positions=shifted_BxL, interventions=patch(slice(None)))
  np.testing.assert_allclose(every.last_hidden_state, clean.last_hidden_state, atol=1e-5)


# ---------------------------------------------------------------------- scan == loop
def every_kind_of_edit(cfg, params):
  clean = run(cfg, params, output_hidden_states=True, output_head_outputs=True)
  p_DxD, bias_D, _ = projection(1)
  return (Interventions.patch_layers(layers_where([0, 2], slice(1, 6)),
                                     stacked(clean.hidden_states[1:]))
          .combine(Interventions.erase(1, p_DxD, bias_D, N))
          .combine(Interventions.patch_heads(heads_where(2, [0, 3]), stacked(clean.head_outputs))))


@pytest.mark.parametrize("make_config", [config, modern], ids=["uniform", "global_local"])
def test_scan_equals_loop_under_every_kind_of_edit(make_config):
  cfg = make_config()
  params = init(cfg)
  edits = every_kind_of_edit(cfg, params)
  kw = dict(output_hidden_states=True, output_head_outputs=True, interventions=edits)
  loop = run(cfg, params, CORRUPT, **kw)
  scan = run(cfg.replace(scan_layers=True), params, CORRUPT, **kw)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), scan, loop)
  assert not np.allclose(loop.pooled, run(cfg, params, CORRUPT).pooled, atol=1e-3)


def test_splash_in_the_scanned_mixed_stack_takes_the_same_edits_as_xla():
  cfg = modern(scan_layers=True)
  params = init(cfg)
  edits = every_kind_of_edit(cfg, params)
  xla = run(cfg, params, CORRUPT, interventions=edits)
  splash = run(cfg.replace(attention_impl="splash"), params, CORRUPT, interventions=edits)
  real = np.asarray(MASK, bool)[..., None]
  np.testing.assert_allclose(np.where(real, splash.last_hidden_state, 0),
                             np.where(real, xla.last_hidden_state, 0), atol=2e-5)


def test_interventions_pass_through_jit():
  cfg = config(scan_layers=True)
  params = loop_to_scan(init(cfg))
  edits = Interventions.erase(1, projection()[0], np.zeros(D), N)
  apply = lambda p, e: Encoder(cfg).apply({"params": p}, IDS, MASK, interventions=e)
  np.testing.assert_allclose(jax.jit(apply)(params, edits).last_hidden_state,
                             apply(params, edits).last_hidden_state, atol=1e-6)


@pytest.mark.parametrize("make_config", [config, modern], ids=["post_norm", "pre_norm"])
def test_no_interventions_trace_the_same_program_as_none(make_config):
  cfg = make_config(scan_layers=True)
  params = loop_to_scan(init(cfg))
  trace = lambda **kw: str(jax.make_jaxpr(
      lambda p: Encoder(cfg).apply({"params": p}, IDS, MASK, **kw))(params))
  assert trace(interventions=None, output_head_outputs=False) == trace()


# ------------------------------------------------------------------ the MLM model
def test_the_mlm_model_passes_interventions_and_head_outputs_to_the_encoder():
  cfg = config(pooling="cls")
  model = EncoderForMaskedLM(cfg)
  variables = model.init(jax.random.key(1), IDS, MASK)
  rows_BxM = jnp.array([[1, 4], [2, 6]])
  plain, _ = model.apply(variables, IDS, MASK, masked_positions=rows_BxM)
  edits = Interventions.zero_layers(layers_where(N - 1, [1, 2]))
  logits, out = model.apply(variables, IDS, MASK, masked_positions=rows_BxM,
                            interventions=edits, output_head_outputs=True)
  assert out.head_outputs[0].shape == (B, L, H, K)
  assert not np.allclose(logits[0, 0], plain[0, 0], atol=1e-3)  # row 1 was zeroed
  np.testing.assert_allclose(logits[1, 1], plain[1, 1], atol=1e-5)  # row 6 was not


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("edits,message", [
    (Interventions.patch_layers(np.ones((N, B, L)), np.ones((N, B, L, D + 1))),
     r"layer_value_NxBxLxD has shape \(3, 2, 12, 33\), expected \[N, B, L, D\] = \[3, 2, 12, 32\]"),
    (Interventions.zero_heads(np.ones((N, B, L - 1, H))),
     r"head_where_NxBxLxH has shape \(3, 2, 11, 4\), expected \[N, B, L, H\] = \[3, 2, 12, 4\]"),
    (Interventions.erase(0, np.eye(D + 2), np.zeros(D + 2), N),
     r"layer_matrix_NxDxD has shape \(3, 34, 34\), expected \[N, D, D\] = \[3, 32, 32\]"),
    (Interventions(head_value_NxBxLxHxK=np.ones((N, B, L, H, K))),
     "head_value_NxBxLxHxK is set without head_where_NxBxLxH"),
])
def test_edits_of_the_wrong_shape_name_the_shape_they_need(edits, message):
  cfg = config()
  with pytest.raises(ValueError, match=message):
    run(cfg, init(cfg), interventions=edits)


def test_combining_two_edits_of_one_field_and_erasing_outside_the_stack_are_refused():
  a = Interventions.zero_layers(np.ones((N, B, L)))
  with pytest.raises(ValueError, match=r"both interventions set \['layer_where_NxBxL'\]"):
    a.combine(a)
  with pytest.raises(ValueError, match=r"layer 3 is outside \[0, 3\)"):
    Interventions.erase(3, np.eye(D), np.zeros(D), N)


def test_an_unknown_option_names_the_options_there_are():
  cfg = config()
  with pytest.raises(TypeError, match=r"unexpected keyword arguments \['intervention'\]"):
    run(cfg, init(cfg), intervention=None)


def test_the_classifier_passes_interventions_to_the_encoder():
  cfg = config()
  model = EncoderClassifier(cfg, num_classes=3)
  variables = model.init(jax.random.key(1), IDS, MASK)
  plain = model.apply(variables, IDS, MASK)
  p_DxD, bias_D, _ = projection()
  erased = model.apply(variables, IDS, MASK, interventions=Interventions.erase(0, p_DxD, bias_D, N))
  identity = model.apply(variables, IDS, MASK,
                         interventions=Interventions.erase(0, np.eye(D), np.zeros(D), N))
  np.testing.assert_array_equal(identity, plain)
  assert not np.allclose(erased, plain, atol=1e-4)
