"""jax.distributed start-up (jaxencoder/train/distributed.py): when it starts, with what.

jax.distributed.initialize is replaced by a recorder; the real two-process runs are in
test_multihost.py.
"""

import pytest

from jaxencoder.train import distributed

CLUSTER_VARS = ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES")


@pytest.fixture
def started(monkeypatch):
  """The keyword arguments of each jax.distributed.initialize call; no cluster variables set."""
  for name in CLUSTER_VARS:
    monkeypatch.delenv(name, raising=False)
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize",
                      lambda **kwargs: calls.append(kwargs))
  return calls


def test_a_single_process_starts_nothing(started, monkeypatch):
  assert distributed.initialize() is False
  monkeypatch.setenv("SLURM_NTASKS", "1")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-0")  # a single-host TPU VM
  assert distributed.initialize() is False
  assert started == []


@pytest.mark.parametrize("name, value", [("SLURM_NTASKS", "4"),
                                         ("TPU_WORKER_HOSTNAMES", "host-0,host-1,host-2")])
def test_slurm_and_multi_host_tpu_are_detected(started, monkeypatch, name, value):
  """The launcher's environment says how many processes: JAX reads the rest itself."""
  monkeypatch.setenv(name, value)
  assert distributed.initialize() is True
  assert started == [dict(coordinator_address=None, num_processes=None, process_id=None,
                          heartbeat_timeout_seconds=distributed.HEARTBEAT_TIMEOUT_S)]


def test_explicit_arguments_start_it_without_a_cluster(started):
  assert distributed.initialize("10.0.0.1:1234", 2, 1) is True
  assert started == [dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1,
                          heartbeat_timeout_seconds=distributed.HEARTBEAT_TIMEOUT_S)]
  assert distributed.initialize(num_processes=1) is False  # one process is no cluster


def test_gather_json_of_one_process_is_its_value():
  assert distributed.gather_json({"a": [1, 2]}) == [{"a": [1, 2]}]
