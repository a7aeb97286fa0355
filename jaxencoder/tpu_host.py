"""libtpu on a host without TPU chips (a laptop or CI machine that only compiles for TPU).

libtpu, when installed (`pip install 'jaxencoder[tpu]'`), probes the host the first time
JAX starts a backend or builds a TPU topology; without chips it prints ~5 lines asking for
TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES. Those only describe a real TPU VM, so on a
host without chips they are given neutral values here (never on a TPU VM, never over a
value the user set).
"""

from __future__ import annotations

import glob
import os

# A single-host slice and this host: what libtpu's start-up probe wants on a chipless host.
CHIPLESS_DEFAULTS = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost",
                     "TPU_SKIP_MDS_QUERY": "1",
                     # no chips to guard: several processes may compile (e.g. test workers)
                     "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def has_tpu_chips() -> bool:
  """TPU chips appear as /dev/accel* (v4, v5e) or VFIO groups (v5p, v6e)."""
  return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def quiet_libtpu_probe() -> None:
  """Sets libtpu's host variables on a chipless host, before JAX loads libtpu. They do
  not change what is compiled: a topology names its own chips (jaxencoder.aot)."""
  if has_tpu_chips():
    return
  for name, value in CHIPLESS_DEFAULTS.items():
    os.environ.setdefault(name, value)
