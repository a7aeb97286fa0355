"""Compile targets: Cloud TPU slices by name, as the devices JAX compiles for.

A name is a Cloud TPU accelerator type (`v5e-8`, `v5litepod-8`, `v4-8`, `v5p-32`,
`v6e-4`: the suffix counts chips on v5e / v6e and TensorCores, two a chip, on v4 / v5p)
or a chip grid (`v5e:2x4`, `v4:2x2x2`, `v5p:2x2x1`, `v6e:4x4`). `slices` > 1 repeats the
slice over the data-center network (multi-slice). The devices come from libtpu's
deviceless topology API (`jax.experimental.topologies`), on any host: a compile for them
is a real TPU executable, but nothing can run.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

from jaxencoder import cli
from jaxencoder.tpu_host import quiet_libtpu_probe

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation. `cores_in_name`: TensorCores per chip counted by the Cloud name
  (v4-8 is 4 chips); `megacore`: its two cores run as one JAX device."""
  name: str  # v4 | v5e | v5p | v6e
  libtpu_name: str  # the generation as libtpu's topology names spell it
  hbm_bytes: int  # per chip (Cloud TPU system architecture pages)
  grid_dims: int  # 3: a 3-D torus (v4, v5p); 2: a 2-D one (v5e, v6e)
  chips_per_host: int  # on a multi-host slice
  cores_in_name: int = 1
  megacore: bool = False
  platform: str = "tpu"
  gpu_facts: tuple[tuple[str, Any], ...] = ()  # GPUs: XLA's GPU target description


CHIPS = {
    "v4": Chip("v4", "v4", 32 * GIB, 3, 4, cores_in_name=2, megacore=True),
    "v5e": Chip("v5e", "v5e", 16 * GIB, 2, 4),
    "v5p": Chip("v5p", "v5", 95 * GIB, 3, 4, cores_in_name=2, megacore=True),
    "v6e": Chip("v6e", "v6e", 32 * GIB, 2, 4),
}
# NVIDIA GPUs, for XLA's deviceless GPU compile (needs jax's CUDA plugin: jax[cuda12]):
# the device facts its compiler reads (vendor data sheets; the rest is Hopper's).
_HOPPER = (("threads_per_block_limit", 1024), ("threads_per_warp", 32),
           ("shared_memory_per_block", 49152), ("shared_memory_per_core", 233472),
           ("threads_per_core_limit", 2048), ("core_count", 132), ("fpus_per_core", 128),
           ("block_dim_limit_x", 2147483647), ("block_dim_limit_y", 65535),
           ("block_dim_limit_z", 65535), ("l2_cache_size", 52428800), ("clock_rate_ghz", 1.98),
           ("shared_memory_per_block_optin", 232448), ("registers_per_core_limit", 65536),
           ("registers_per_block_limit", 65536))
GPUS = {
    "h100": Chip("h100", "NVIDIA H100 80GB HBM3", 84929347584, 1, 8, platform="gpu",
                 gpu_facts=_HOPPER + (("memory_bandwidth", 3352320000000),)),
    "h200": Chip("h200", "NVIDIA H200", 150754820096, 1, 8, platform="gpu",
                 gpu_facts=_HOPPER + (("memory_bandwidth", 4800000000000),)),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}
SINGLE_HOST_GRIDS = {1: (1, 1), 4: (2, 2), 8: (2, 4)}  # v5e / v6e slices on one host
ACCEPTED = ("a Cloud TPU type: v4-8, v4-16, ..., v5e-1, v5e-4, v5e-8, v5e-16, ... "
            "(also v5litepod-8), v5p-8, v5p-16, v5p-32, ..., v6e-1, v6e-4, v6e-8, ...; or a chip "
            "grid: v5e:2x4, v6e:4x4, v4:2x2x2, v5p:2x2x4; or NVIDIA GPUs: h100, h200, h100-8, "
            "h200-16 (8 a host)")


class UnknownTopologyError(ValueError):
  """A topology name that is neither a Cloud TPU type nor a chip grid."""


@dataclasses.dataclass(frozen=True)
class Target:
  """A TPU slice (times `slices`) to compile for."""
  name: str  # as the user wrote it
  chip: Chip
  grid: tuple[int, ...]  # chips along each torus axis of one slice
  slices: int = 1

  @property
  def chips_per_slice(self) -> int:
    return math.prod(self.grid)

  @property
  def num_chips(self) -> int:
    return self.chips_per_slice * self.slices

  @property
  def hosts(self) -> int:
    return self.slices * (1 if self.single_host else self.chips_per_slice // self.chip.chips_per_host)

  @property
  def single_host(self) -> bool:
    return self.chip.grid_dims == 2 and self.chips_per_slice in SINGLE_HOST_GRIDS or (
        self.chips_per_slice <= self.chip.chips_per_host)

  @property
  def topology_name(self) -> str:
    if self.chip.platform == "gpu":  # partitions x hosts x GPUs per host
      per_host = min(self.chips_per_slice, self.chip.chips_per_host)
      return f"{self.slices}x{self.chips_per_slice // per_host}x{per_host}"
    grid = self.grid if self.chip.grid_dims == 2 else (self.grid + (1,) * 3)[:3]
    return f"{self.chip.libtpu_name}:{'x'.join(map(str, grid))}"

  def describe(self) -> str:
    slices = f" x {self.slices} slices" if self.slices > 1 else ""
    unit = "GPU" if self.chip.platform == "gpu" else "chip"
    return (f"{self.name}{slices}: {self.num_chips} {self.chip.name} {unit}"
            f"{'s' * (self.num_chips != 1)} ({self.topology_name}, {self.hosts} host"
            f"{'s' * (self.hosts != 1)}), {self.chip.hbm_bytes / GIB:.4g} GiB HBM each")


def _grid_for(chip: Chip, chips: int) -> tuple[int, ...] | None:
  """The grid of a Cloud slice of `chips` chips (powers of two; others: name a grid)."""
  if chips < 1 or chips & (chips - 1):
    return None
  if chip.grid_dims == 2:
    if chips in SINGLE_HOST_GRIDS:
      return SINGLE_HOST_GRIDS[chips]
    side = 1 << (chips.bit_length() - 1) // 2
    return (side, chips // side)  # 16: 4x4, 32: 4x8, 256: 16x16
  if chips < 4:
    return None
  grid, doublings = [2, 2, 1], 0  # v4-8 / v5p-8: 2x2x1; 2x2x2; then z, y, x in turn
  while math.prod(grid) < chips:
    grid[2 if doublings == 0 else 2 - (doublings - 1) % 3] *= 2
    doublings += 1
  return tuple(grid)


def parse_target(name: str, slices: int = 1) -> Target:
  """A Target from a Cloud TPU type or a chip grid; a bad name raises
  UnknownTopologyError listing the accepted forms."""
  text = name.strip().lower()
  if slices < 1:
    raise UnknownTopologyError(f"--slices {slices}: a target has at least one slice")
  gpu = re.fullmatch(r"(h100|h200)(?:-(\d+))?", text)
  if gpu:
    count = int(gpu.group(2) or 1)
    if count > 8 and count % 8:
      raise UnknownTopologyError(f"topology {name!r}: more than 8 GPUs come in hosts of 8; "
                                 f"use {ACCEPTED}")
    return Target(name, GPUS[gpu.group(1)], (count,), slices)
  grid_match = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", text)
  type_match = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  match = grid_match or type_match
  chip = match and CHIPS.get(ALIASES.get(match.group(1), match.group(1)))
  if chip is None and match and match.group(1) == "v5":  # libtpu's own spelling of v5p
    chip = CHIPS["v5p"]
  if chip is None:
    raise UnknownTopologyError(f"unknown topology {name!r}: {_did_you_mean(text, match)}"
                               f"use {ACCEPTED}")
  if grid_match:
    grid = tuple(int(n) for n in grid_match.group(2).split("x"))
    if len(grid) != chip.grid_dims and not (chip.grid_dims == 3 and len(grid) == 2):
      raise UnknownTopologyError(f"topology {name!r}: {chip.name} chips form a "
                                 f"{chip.grid_dims}-D grid; use {ACCEPTED}")
  else:
    count = int(type_match.group(2))
    grid = None if count % chip.cores_in_name else _grid_for(chip, count // chip.cores_in_name)
    if grid is None:
      raise UnknownTopologyError(f"unknown topology {name!r}: no standard {chip.name} slice "
                                 f"has that size (name its chip grid instead, e.g. "
                                 f"{chip.name}:4x4{'x4' * (chip.grid_dims == 3)}); use {ACCEPTED}")
  return Target(name, chip, grid, slices)


def _did_you_mean(text: str, match) -> str:
  """"did you mean v5e-8? " for a misspelt generation (v5f-8), else ""."""
  suffix = text[len(match.group(1)):] if match else ""
  names = [f"{generation}{suffix}" for generation in (*CHIPS, *ALIASES, *GPUS)]
  return f"{hint} " if (hint := cli.did_you_mean(text, names)) else ""


def gpu_target_config(chip: Chip) -> str:
  """XLA's GPU target description (a GpuTargetConfigProto in text form) for `chip`."""
  facts = dict(chip.gpu_facts, device_memory_size=chip.hbm_bytes)
  fields = "\n".join(f"  {k}: {v}" for k, v in facts.items())
  return (f"gpu_device_info {{\n{fields}\n  cuda_compute_capability {{ major: 9 }}\n}}\n"
          "runtime_version { major: 12 minor: 8 }\nplatform_name: \"CUDA\"\n"
          f"dnn_version_info {{ major: 9 minor: 7 }}\ndevice_description_str: "
          f"\"{chip.libtpu_name}\"\n")


# Deviceless GPU compiles: Triton matmuls need on-device autotuning to find their tiles (an
# f32 dot fails without it), so matmuls compile to cuBLAS calls here; memory is what the
# GPU needs, the kernels are not all the ones an on-GPU compile picks.
GPU_AOT_XLA_FLAGS = "--xla_gpu_enable_triton_gemm=false"


def _gpu_devices(target: Target) -> list:
  # A GPU-less host: jax's CUDA plugin would otherwise refuse to start without a driver.
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if "xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {GPU_AOT_XLA_FLAGS}".strip()
  from jax.experimental import topologies  # lazy: --help stays fast
  try:
    topology = topologies.get_topology_desc(platform="cuda", topology=target.topology_name,
                                            target_config=gpu_target_config(target.chip))
  except Exception as e:  # no CUDA plugin
    raise UnknownTopologyError(
        f"cannot compile for {target.chip.name}: {_with_install_hint(e)} (compiling for NVIDIA "
        "GPUs needs jax's CUDA plugin: pip install 'jaxencoder[cuda]')") from None
  return list(topology.devices)


def target_devices(target: Target) -> list:
  """Compile-only devices of the target (libtpu, or jax's CUDA plugin, on this host; no
  chips needed)."""
  if target.chip.platform == "gpu":
    return _gpu_devices(target)
  quiet_libtpu_probe()
  # lazy: --help stays fast (and it loads after the probe's variables are set)
  from jax.experimental import topologies
  kwargs = {}
  if target.chip.megacore:
    kwargs["chip_config_name"] = "megacore"
  host_grid = (target.grid + (1,) * 3)[:3] if target.single_host else (2, 2, 1)
  kwargs["chips_per_host_bounds"] = host_grid
  if target.slices > 1:
    kwargs["num_slices"] = target.slices
  try:
    topology = topologies.get_topology_desc(topology_name=target.topology_name,
                                            platform="tpu", **kwargs)
  except Exception as e:  # no libtpu, or a grid libtpu rejects
    raise UnknownTopologyError(f"cannot build TPU topology {target.topology_name!r}: "
                               f"{_with_install_hint(e)}") from None
  return list(topology.devices)


def _with_install_hint(error: Exception) -> str:
  """The first line of a topology error, and where libtpu is missing, how to install it."""
  text = str(error).strip().splitlines()
  message = text[0] if text else type(error).__name__
  if "libtpu" in message.lower() or isinstance(error, (ImportError, RuntimeError)) and (
      "tpu" in message.lower()):
    message += " (is libtpu installed? pip install 'jaxencoder[tpu]')"
  return message
