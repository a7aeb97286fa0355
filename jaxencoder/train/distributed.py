"""Multi-process (multi-host) runs with JAX's own runtime, `jax.distributed`.

One program runs on every host. `initialize` starts the runtime when this process
is one of several: explicitly (coordinator address, process count and id, e.g.
from a launcher), or auto-detected on Cloud TPU pods and under SLURM. Afterwards
`jax.devices()` spans every host and meshes built from it are global.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger("jaxencoder")

# Seconds without a heartbeat before the coordinator declares a process dead and the
# others fail (JAX's default is 100 s; shorter fails fast after a crash).
HEARTBEAT_TIMEOUT_S = 30


def _cluster_detected() -> bool:
  """SLURM with several tasks, or a multi-host Cloud TPU slice."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) > 1


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Starts jax.distributed when this run has several processes; True if it did.

  Explicit arguments win; otherwise SLURM and Cloud TPU are detected from the
  environment. A single process (the default) starts nothing.
  """
  explicit = coordinator_address is not None or (num_processes or 1) > 1
  if not explicit and not _cluster_detected():
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  log.info("jax.distributed: process %d of %d, %d local / %d global devices",
           jax.process_index(), jax.process_count(), jax.local_device_count(),
           jax.device_count())
  return True


def gather_json(value) -> list:
  """Every process's JSON-able `value`, in process order (on every process)."""
  if jax.process_count() == 1:
    return [value]
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([data.size], np.int32))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:data.size] = data
  everyone = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(n)]).decode())
          for row, n in zip(everyone, lengths.reshape(-1))]
