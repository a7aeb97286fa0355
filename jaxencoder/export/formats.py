"""The Servable (a model as a pure function of int32 [B, L] arrays, params baked in) and
the two formats it is written in: serialized StableHLO (jax.export) and ONNX (jax2onnx),
read back and checked against JAX (the package docstring shows the calls).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import pathlib
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun, jaxprs_in_params

from jaxencoder import cli
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import Encoder
from jaxencoder.export import CHECK_SHAPE, FILES, PLATFORMS, SPEC, onnx_matmul


# protobuf's limit on one message (onnx.checker.MAXIMUM_PROTOBUF): a larger ONNX model
# keeps its weights in an external-data file beside it.
ONNX_ONE_FILE_BYTES = 2**31 - 1


class Unsupported(cli.UserError):
  """The model holds an operation the format cannot express."""


@dataclasses.dataclass(frozen=True)
class Servable:
  """A model as a pure function of named int32 [B, L] arrays, params baked in."""
  fn: Callable[..., tuple]
  inputs: tuple[str, ...]
  outputs: tuple[str, ...]
  cfg: EncoderConfig
  max_len: int | None  # the longest L (learned positions); None: any
  source: dict = dataclasses.field(default_factory=dict)
  labels: list[str] | None = None

  def input_specs(self) -> list:
    """ShapeDtypeStructs [B, L] sharing the symbolic dims B and L."""
    limit = [f"L <= {self.max_len}"] if self.max_len else []
    shape = jax.export.symbolic_shape("B, L", constraints=limit)
    return [jax.ShapeDtypeStruct(shape, jnp.int32) for _ in self.inputs]


def servable(cfg: EncoderConfig, params, *, head=None, **info) -> Servable:
  """Encoder params -> last_hidden_state and pooled; with `head` (an EncoderClassifier)
  and its task params -> logits. `info`: Servable's source / labels."""
  if cfg.input_kind != "text":
    raise ValueError(f"export takes text encoders; this model's input_kind is "
                     f"{cfg.input_kind!r}")
  # Host-side id checks cannot be serialized; portable XLA attention, no remat.
  cfg = dataclasses.replace(cfg, check_ids=False, attention_impl="xla", remat_policy="none")
  inputs = ("input_ids", "attention_mask") + (("token_type_ids",) if cfg.type_vocab_size else ())
  if head is None:
    model, outputs = Encoder(cfg), ("last_hidden_state", "pooled")
    pick = lambda out: (out.last_hidden_state, out.pooled)
  else:
    model, outputs, pick = head.clone(cfg=cfg), ("logits",), lambda out: (out,)

  def fn(*arrays):
    return pick(model.apply({"params": params}, *arrays))
  max_len = cfg.max_positions if cfg.position_embedding == "learned" else None
  return Servable(fn, inputs, outputs, cfg, max_len, **info)


def trace(s: Servable, fmt: str) -> tuple:
  """(ClosedJaxpr, input specs) of the model; Unsupported names a host callback in it."""
  specs = s.input_specs()
  closed = jax.make_jaxpr(s.fn)(*specs)
  callbacks = sorted({p for p in primitives(closed.jaxpr) if "callback" in p})
  if callbacks:
    raise Unsupported(f"{fmt}: the model calls back into Python ({', '.join(callbacks)}), "
                      "which an exported model cannot do")
  return closed, specs


def primitives(jaxpr) -> set[str]:
  """Names of the primitives in a jaxpr and the jaxprs inside it."""
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for inner in jaxprs_in_params(eqn.params):
      names |= primitives(inner)
  return names


def export_stablehlo(s: Servable, path, platforms=PLATFORMS) -> None:
  """Writes `jax.export`'s serialized program (StableHLO + calling convention)."""
  _, specs = trace(s, "stablehlo")
  exported = jax.export.export(jax.jit(s.fn), platforms=platforms)(*specs)
  pathlib.Path(path).write_bytes(exported.serialize())


def export_onnx(s: Servable, path, *, matmul: bool = True) -> str | None:
  """Writes an ONNX model (opset 23) with the dims B and L symbolic; `matmul`: its dense
  layers' Einsums as MatMuls (onnx_matmul.py). Returns save_onnx's external-data file."""
  to_onnx, version = _jax2onnx()
  # Traced by JAX first: jax2onnx 0.17.1 traces jnp.arange itself and makes a symbolic
  # stop a data-dependent dim, which masks.make_attention_mask cannot index; its jaxpr
  # holds plain iota primitives instead. The same specs: their dims B, L are its dims.
  closed, specs = trace(s, "onnx")
  program = jaxpr_as_fun(closed)
  try:
    model = to_onnx(lambda *arrays: tuple(program(*arrays)), specs,
                    input_names=list(s.inputs), output_names=list(s.outputs),
                    model_name="jaxencoder", return_mode="proto")
  except NotImplementedError as e:
    op = re.search(r"primitive '([^']+)'", str(e))
    raise Unsupported(f"onnx: jax2onnx {version} has no conversion for JAX primitive "
                      f"{op.group(1) if op else str(e)!r}; try --format stablehlo") from None
  if matmul:
    onnx_matmul.einsums_to_matmul(model)
  return save_onnx(model, path)


def save_onnx(model, path) -> str | None:
  """Writes the ModelProto `model` to `path` as one file when it fits in one protobuf
  (ONNX_ONE_FILE_BYTES); a larger one keeps its weights in PATH.data beside it (onnx's
  external data), whose name it returns (None: one file)."""
  import onnx  # lazy: optional extra export (onnx)
  path = pathlib.Path(path)
  if model.ByteSize() < ONNX_ONE_FILE_BYTES:
    onnx.save_model(model, str(path))
    return None
  data = path.name + ".data"
  onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data, size_threshold=1024)
  return data


def _jax2onnx():
  """(jax2onnx.to_onnx, its version), its chatter quiet; a UserError naming the install."""
  try:
    from jax2onnx import to_onnx  # lazy: optional extra export (jax2onnx, installed apart)
  except ImportError:
    raise cli.UserError("--format onnx needs jax2onnx and onnxruntime: pip install "
                        "'jaxencoder[export]' && pip install --no-deps jax2onnx==0.17.1") from None
  if not cli.verbose():
    for name in ("jax2onnx", "onnx_ir"):
      logging.getLogger(name).setLevel(logging.CRITICAL)
  return to_onnx, importlib.metadata.version("jax2onnx")


def load_exported(out) -> Callable[..., list]:
  """The export in directory `out` as a function: int32 [B, L] arrays in export.json's
  input order -> its outputs (numpy), run by jax (stablehlo) or onnxruntime (onnx)."""
  out = pathlib.Path(out)
  spec = json.loads((out / SPEC).read_text())
  run = runner(spec["format"], out / spec["file"], [i["name"] for i in spec["inputs"]])

  def checked(*arrays):
    length = spec["max_len"]
    if length and arrays[0].shape[1] > length:
      raise ValueError(f"sequence length {arrays[0].shape[1]} > {length} (the position table)")
    return run(*arrays)
  return checked


def runner(fmt: str, path, names) -> Callable[..., list]:
  """Runs an exported file: jax.export.deserialize(...).call or an onnxruntime session."""
  as_int32 = lambda arrays: [np.asarray(a, np.int32) for a in arrays]
  if fmt == "stablehlo":
    call = jax.jit(jax.export.deserialize(pathlib.Path(path).read_bytes()).call)
    return lambda *arrays: [np.asarray(y) for y in call(*as_int32(arrays))]
  import onnxruntime  # lazy: optional extra export (onnxruntime)
  session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
  return lambda *arrays: session.run(None, dict(zip(names, as_int32(arrays))))


def check(s: Servable, fmt: str, path) -> dict[str, float]:
  """Max |exported - JAX| per output on a padded batch of CHECK_SHAPE random ids."""
  arrays = example_batch(s, *CHECK_SHAPE)
  expected = jax.jit(s.fn)(*arrays)
  got = runner(fmt, path, s.inputs)(*arrays)
  return {name: float(np.max(np.abs(np.asarray(e, np.float32) - g)))
          for name, e, g in zip(s.outputs, expected, got)}


def example_batch(s: Servable, batch: int, length: int, seed: int = 0) -> list:
  """Random int32 inputs [batch, length], right-padded: row b has max(1, length - b *
  max(1, length // (2 * batch))) real tokens; type ids 0 for the first half, then 1."""
  rng = np.random.default_rng(seed)
  ids_BxL = rng.integers(1, s.cfg.vocab_size, (batch, length), dtype=np.int32)
  real_B = np.maximum(length - np.arange(batch) * max(length // (2 * batch), 1), 1)
  mask_BxL = (np.arange(length)[None] < real_B[:, None]).astype(np.int32)
  types_BxL = (np.arange(length)[None] >= length // 2).astype(np.int32).repeat(batch, 0)
  return [ids_BxL * mask_BxL, mask_BxL, types_BxL * mask_BxL][:len(s.inputs)]


def describe(s: Servable, fmt: str, **extra) -> dict[str, Any]:
  """export.json: what to feed the exported model and what comes back (a classifier's
  class names as id2label, Hugging Face's config.json key: {"0": name, ...})."""
  dims = lambda shape: [d if isinstance(d, int) else str(d) for d in shape]
  specs = s.input_specs()
  outs = jax.eval_shape(s.fn, *specs)
  return {"format": fmt, "file": FILES[fmt],
          "inputs": [{"name": n, "dtype": "int32", "shape": dims(x.shape)}
                     for n, x in zip(s.inputs, specs)],
          "outputs": [{"name": n, "dtype": str(y.dtype), "shape": dims(y.shape)}
                      for n, y in zip(s.outputs, outs)],
          "symbolic_dims": {"B": "batch, >= 1",
                            "L": f"sequence length, 1..{s.max_len}" if s.max_len else
                                 "sequence length, >= 1"},
          "max_len": s.max_len, "pooling": s.cfg.pooling, "id2label": id2label(s.labels),
          "source": s.source, "jax": jax.__version__, "model": s.cfg.to_dict(), **extra}


def id2label(names: list[str] | None) -> dict[str, str] | None:
  """Class index (a JSON key, so a string) -> name; None when the model has no classes."""
  return {str(i): name for i, name in enumerate(names)} if names else None
