"""Activations, norms and where the block puts them, against numpy formulas with fixed
weights: each activation (and which branch of a GLU is the gate), LayerNorm and RMSNorm
with their epsilon, post-norm (BERT) and pre-norm wiring, and remat in the traced program."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder import Encoder
from jaxencoder.model.encoder import REMAT_POLICIES
from jaxencoder.model.ffn import FeedForward
from jaxencoder.model.layers import norm

D, F = 4, 6
_erf = np.vectorize(math.erf)
FORMULAS = {
    "gelu": lambda h: 0.5 * h * (1 + _erf(h / np.sqrt(2))),
    "gelu_tanh": lambda h: 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3))),
    "relu": lambda h: np.maximum(h, 0),
    "silu": lambda h: h / (1 + np.exp(-h)),
}
# activation -> (formula of the gate or sole branch, gated)
ACTIVATIONS = {"gelu": ("gelu", False), "gelu_tanh": ("gelu_tanh", False),
               "relu": ("relu", False), "swiglu": ("silu", True), "geglu": ("gelu", True)}


def dense_params(rng, fan_in, fan_out, scale):
  return {"kernel": rng.normal(size=(fan_in, fan_out)).astype(np.float32) * scale,
          "bias": rng.normal(size=(fan_out,)).astype(np.float32) * 0.5}


def ffn_reference(x, params, activation):
  """wo(act(x Wi + bi)) or wo(act(x Wg + bg) * (x Wu + bu)), in float64."""
  x = np.asarray(x, np.float64)
  lin = lambda p, v: v @ p["kernel"].astype(np.float64) + p["bias"]
  formula, gated = ACTIVATIONS[activation]
  act = FORMULAS[formula]
  h = act(lin(params["wi_gate"], x)) * lin(params["wi_up"], x) if gated else act(lin(params["wi"], x))
  return lin(params["wo"], h)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_feed_forward_equals_its_formula_with_fixed_weights(activation):
  rng = np.random.default_rng(0)
  _, gated = ACTIVATIONS[activation]
  names = ("wi_gate", "wi_up") if gated else ("wi",)
  params = {name: dense_params(rng, D, F, 1.0) for name in names}
  params["wo"] = dense_params(rng, F, D, 1.0)
  x = rng.normal(size=(2, 5, D)).astype(np.float32)  # pre-activations spread over about [-4, 4]
  cfg = tiny_config(emb_dim=D, num_heads=1, mlp_dim=F, activation=activation)
  got = FeedForward(cfg).apply({"params": params}, jnp.asarray(x), deterministic=True)
  expected = ffn_reference(x, params, activation)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # The tolerance tells the neighbours apart: another activation, or a GLU's branches swapped.
  others = [a for a in ACTIVATIONS if ACTIVATIONS[a][1] == gated and a != activation]
  for other in others:
    assert np.abs(ffn_reference(x, params, other) - expected).max() > 1e-3, other
  if gated:
    swapped = {**params, "wi_gate": params["wi_up"], "wi_up": params["wi_gate"]}
    assert np.abs(ffn_reference(x, swapped, activation) - expected).max() > 1e-2


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_norm_equals_its_formula_with_epsilon_inside_the_root(kind):
  rng = np.random.default_rng(1)
  x = (rng.normal(size=(3, D)) * 0.3 + 0.7).astype(np.float32)  # a mean, and var ~ eps
  scale = rng.normal(size=(D,)).astype(np.float32)
  bias = rng.normal(size=(D,)).astype(np.float32)
  eps = 0.05
  cfg = tiny_config(emb_dim=D, num_heads=1, norm=kind, norm_eps=eps)
  params = {"scale": scale} if kind == "rmsnorm" else {"scale": scale, "bias": bias}
  got = norm(cfg).apply({"params": params}, jnp.asarray(x))
  x64 = x.astype(np.float64)
  if kind == "layernorm":
    centred = x64 - x64.mean(-1, keepdims=True)
    expected = centred / np.sqrt(centred.var(-1, keepdims=True) + eps) * scale + bias
  else:
    expected = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * scale
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
  assert set(norm(cfg).init(jax.random.key(0), jnp.asarray(x))["params"]) == set(params)


# ------------------------------------------------------------------ where the norms sit
def block_calls(cfg, ids):
  """Per encoder layer, the input and output of each of its submodules (intercepted)."""
  calls = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "__call__" and context.module.scope is not None:
      calls.append((tuple(context.module.scope.path), args[0] if args else None, out))
    return out

  model = Encoder(cfg)
  variables = model.init(jax.random.key(0), ids)
  with nn.intercept_methods(record):
    out = model.apply(variables, ids, output_hidden_states=True)
  layers = {}
  for path, arg, result in calls:
    if len(path) >= 1 and path[0].startswith("layers_"):
      layers.setdefault(path[0], {})[path[1:]] = (arg, result)
  return out, layers


def close(a, b):
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_kind", ["layernorm", "rmsnorm"])
def test_post_norm_normalises_each_residual_sum(norm_kind):
  """BERT: x1 = norm(x + attention(x)); out = norm(x1 + ffn(x1))."""
  cfg = tiny_config(norm_position="post", norm=norm_kind)
  out, layers = block_calls(cfg, random_ids(0, (2, 6)))
  for i, calls in sorted(layers.items()):
    x, block_out = calls[()][0], calls[()][1][0]
    attn_in, (attn_out, _, _) = calls[("attention",)]  # (output, weights, head outputs)
    norm_a_in, norm_a_out = calls[("attention_norm",)]
    ffn_in, ffn_out = calls[("ffn",)]
    norm_f_in, norm_f_out = calls[("ffn_norm",)]
    close(attn_in, x)
    close(norm_a_in, x + attn_out)
    close(ffn_in, norm_a_out)
    close(norm_f_in, norm_a_out + ffn_out)
    close(block_out, norm_f_out)
  close(out.last_hidden_state, out.hidden_states[-1])
  assert "final_norm" not in Encoder(cfg).init(jax.random.key(0), random_ids(0, (1, 4)))["params"]


@pytest.mark.parametrize("norm_kind", ["layernorm", "rmsnorm"])
def test_pre_norm_normalises_each_branch_input_and_the_stack_output(norm_kind):
  """x1 = x + attention(norm(x)); x2 = x1 + ffn(norm(x1)); the stack ends in final_norm."""
  cfg = tiny_config(norm_position="pre", norm=norm_kind)
  ids = random_ids(0, (2, 6))
  out, layers = block_calls(cfg, ids)
  for i, calls in sorted(layers.items()):
    x, block_out = calls[()][0], calls[()][1][0]
    norm_a_in, norm_a_out = calls[("attention_norm",)]
    attn_in, (attn_out, _, _) = calls[("attention",)]  # (output, weights, head outputs)
    norm_f_in, norm_f_out = calls[("ffn_norm",)]
    ffn_in, ffn_out = calls[("ffn",)]
    close(norm_a_in, x)
    close(attn_in, norm_a_out)
    close(norm_f_in, x + attn_out)
    close(ffn_in, norm_f_out)
    close(block_out, x + attn_out + ffn_out)  # no norm on the residual stream
  params = Encoder(cfg).init(jax.random.key(0), ids)["params"]
  last = layers[f"layers_{cfg.num_layers - 1}"][()][1][0]
  final = norm(cfg).apply({"params": params["final_norm"]}, last)
  close(out.last_hidden_state, final)


# ------------------------------------------------------------------ remat
def remat_eqns(jaxpr) -> list:
  """Every remat (jax.checkpoint) equation, also inside scan bodies and other sub-jaxprs."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("checkpoint", "remat", "remat2"):
      found.append(eqn)
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (list, tuple)) else [value]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found += remat_eqns(inner)
  return found


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("policy", ["none", "full", "save_dots", "save_dots_no_batch"])
def test_remat_policy_is_in_the_traced_program(policy, scan_layers):
  cfg = tiny_config(num_layers=3, scan_layers=scan_layers, remat_policy=policy)
  ids = random_ids(0, (2, 6))
  model = Encoder(cfg)
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids))["params"]
  loss = lambda p: jnp.sum(model.apply({"params": p}, ids).last_hidden_state)
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), params)
  eqns = remat_eqns(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  if policy == "none":
    assert eqns == []
    return
  assert len(eqns) >= (1 if scan_layers else cfg.num_layers)  # one per block (scan: its body)
  assert all(e.params["policy"] is REMAT_POLICIES[policy] for e in eqns)
  assert all(e.params["prevent_cse"] is not scan_layers for e in eqns)


def test_remat_recomputes_the_block_in_the_backward_pass():
  """Under 'full' remat the gradient program runs each block's matmuls twice."""
  cfg = tiny_config(num_layers=2)
  ids = random_ids(0, (2, 6))

  def dots(policy):
    model = Encoder(cfg.replace(remat_policy=policy))
    params = nn.meta.unbox(model.init(jax.random.key(0), ids))["params"]
    loss = lambda p: jnp.sum(model.apply({"params": p}, ids).last_hidden_state)
    hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    return hlo.count(" dot(")
  assert dots("full") > dots("none")
