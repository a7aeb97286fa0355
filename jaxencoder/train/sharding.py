"""Meshes and shardings from logical axis names (the rules live in the config)."""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

log = logging.getLogger("jaxencoder")

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch is split over both

# Logical -> mesh axes: data/FSDP/tensor parallelism for an encoder.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("act_batch", BATCH_AXES),
    ("act_len", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)


def mesh_shape(requested: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills one -1 entry with the devices left; checks the product."""
  shape = list(requested)
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {tuple(requested)}: at most one axis may be -1")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh shape {tuple(requested)} does not divide {num_devices} devices")
    shape[shape.index(-1)] = num_devices // known
  if int(np.prod(shape)) != num_devices:
    raise ValueError(f"mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices, "
                     f"have {num_devices}")
  return tuple(shape)


def batch_devices(requested: Sequence[int], num_devices: int) -> tuple[int, str]:
  """(how many devices a batch is split over: the product of the BATCH_AXES of the mesh
  `requested` makes of `num_devices`, those axes as `data=4, fsdp=2`)."""
  sizes = dict(zip(MESH_AXES, mesh_shape(requested, num_devices)))
  split = {axis: sizes[axis] for axis in BATCH_AXES}
  named = ", ".join(f"{axis}={n}" for axis, n in split.items() if n > 1 or axis == "data")
  return int(np.prod(list(split.values()))), named


def use_cpu_devices(count: int) -> None:
  """Splits the host CPU into `count` JAX devices (config.cpu_devices; 0 leaves it as is).

  A small model's step on a few cores runs faster data-parallel over one device per core
  than as one device whose small ops are each split across the cores (configs/
  vit_fashion_mnist.py on 2 cores: 0.035 s a step with 2 devices, 0.054 s with 1;
  bench/cpu_devices.py). Takes effect only before JAX's first computation, and not where
  XLA_FLAGS already sets a device count (the tests' 8); otherwise it logs why it was left.
  """
  if count <= 0:
    return
  if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
    log.info("cpu_devices=%d left: XLA_FLAGS sets the CPU device count", count)
    return
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # JAX already computed something: its CPU devices are fixed
    log.warning("cpu_devices=%d left: JAX already started with %d CPU devices; set it "
                "before the first JAX computation", count, len(jax.devices("cpu")))


def make_mesh(requested: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Mesh over axes (data, fsdp, tensor); -1 takes the remaining devices. TPU devices are
  laid out along the chips' torus (jax's mesh_utils), others in order."""
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(requested, len(devices))
  return Mesh(_device_grid(shape, devices), MESH_AXES)


def _device_grid(shape: tuple[int, ...], devices: list) -> np.ndarray:
  """Devices as an array of `shape`: on TPU, neighbours on the mesh are neighbours on the
  interconnect; a multi-slice job puts the data axis across slices when it divides."""
  if devices[0].platform != "tpu":
    return np.asarray(devices).reshape(shape)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  try:
    if slices > 1 and shape[0] % slices == 0:
      per_slice = (shape[0] // slices, *shape[1:])
      return mesh_utils.create_hybrid_device_mesh(per_slice, (slices, 1, 1), devices)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError) as e:  # a shape the torus cannot take
    log.info("mesh %s laid out in device order (%s)", shape, e)
    return np.asarray(devices).reshape(shape)


def rules_from_config(rules) -> tuple[tuple[str, Any], ...]:
  """Config rules (lists from ConfigDict) -> tuple pairs, mesh axes as str/tuple/None."""
  def axes(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value
  return tuple((name, axes(value)) for name, value in rules)


def logical_shardings(boxed_tree, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree of nn.Partitioned leaves (plain leaves replicate).

  A dimension that its mesh axes do not divide evenly (e.g. a 30522 vocab over
  8 devices) is left unsharded rather than failing.
  """
  def one(leaf):
    if not isinstance(leaf, nn.Partitioned):
      return NamedSharding(mesh, P())
    spec = nn.logical_to_mesh_axes(leaf.names, rules)
    return NamedSharding(mesh, divisible_spec(spec, leaf.value.shape, mesh))
  return jax.tree.map(one, boxed_tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def divisible_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops mesh axes from dimensions they do not divide."""
  def size(axes) -> int:
    axes = axes if isinstance(axes, tuple) else (axes,)
    return int(np.prod([mesh.shape[a] for a in axes if a is not None]))
  entries = list(spec) + [None] * (len(shape) - len(spec))
  return P(*(axes if axes is None or dim % size(axes) == 0 else None
             for axes, dim in zip(entries, shape)))


def optimizer_shardings(tx: optax.GradientTransformation, opt_shapes, param_shardings,
                        mesh: Mesh) -> Any:
  """Param-shaped optimizer leaves take their param's sharding; the rest replicate.

  Frozen params leave `optax.MaskedNode` placeholders in the state; they stay as is.
  """
  replicated = NamedSharding(mesh, P())
  keep_masked = lambda value, sharding: value if isinstance(value, optax.MaskedNode) else sharding
  return optax.tree_map_params(
      tx, keep_masked, opt_shapes, param_shardings,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, (NamedSharding, optax.MaskedNode)))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over data and fsdp; other axes replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Places a host batch on the mesh (single process: the global batch)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}
