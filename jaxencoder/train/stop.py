"""Stopping on a signal without losing the run (Cloud TPU preemption, SLURM, Ctrl-C).

SIGTERM or SIGINT only sets a flag; the loop checks it between steps and inside
eval, saves the latest finished step, waits for every save to be durable and
raises `Preempted`. train.py turns that into exit code `EXIT_PREEMPTED` (75,
EX_TEMPFAIL: "try again"), which job schedulers can requeue on; rerunning the same
command resumes from that step. A second Ctrl-C in train.py ends the process at once
with one line and exit code 130 (`EXIT_INTERRUPTED`): a save in flight is abandoned
(orbax never lists a step it did not finish); a rerun resumes from the last finished one.

With several processes every one must stop at the same step: JAX's preemption
service (started by jax.distributed) catches SIGTERM on any host and agrees on a
step, which `should_stop(step)` reports on all of them.

A disk that fills up during a save ends train.py with EXIT_PREEMPTED too, after one line
naming it (`full_disk`): rerun once there is space.
"""

from __future__ import annotations

import os
import signal
import sys

import jax
from jax.experimental import multihost_utils

from jaxencoder.errors import is_out_of_space
from jaxencoder.io.checkpoint import OutOfSpace

EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
# train.py sets it: a second Ctrl-C ends the process (interrupt_now). Called from Python
# (a notebook), a second Ctrl-C raises KeyboardInterrupt, which the caller survives.
exit_on_second_interrupt = False


class Preempted(Exception):
  """Training stopped on a signal after `step` was saved durably in `directory`."""

  def __init__(self, signal_name: str, step: int | None, directory):
    self.signal_name, self.step, self.directory = signal_name, step, directory
    where = (f"step {step} is saved in {directory}" if step is not None
             else f"no step was finished, nothing new to save in {directory}")
    super().__init__(f"{signal_name}: stopped; {where}; rerun the same command to resume")


class StopSignals:
  """Records SIGTERM / SIGINT while installed (a context manager)."""

  def __init__(self):
    self.received: str | None = None
    self._previous = {}

  def __enter__(self) -> "StopSignals":
    # With several processes JAX's preemption service owns SIGTERM (see should_stop), and
    # Ctrl-C interrupts as usual: the run resumes from its last checkpoint.
    wanted = [signal.SIGINT, signal.SIGTERM] if jax.process_count() == 1 else []
    for signum in wanted:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def _handle(self, signum, frame) -> None:
    if self.received == "SIGINT" and signum == signal.SIGINT:
      if exit_on_second_interrupt:
        interrupt_now()
      raise KeyboardInterrupt  # a second Ctrl-C: stop now
    self.received = signal.Signals(signum).name

  def requested(self) -> bool:
    """A signal arrived (single process: lets eval stop early; with several processes
    eval is collective and runs to its end)."""
    return self.received is not None and jax.process_count() == 1

  def should_stop(self, step: int) -> bool:
    """Whether to save and stop after `step`; the same answer on every process."""
    if jax.process_count() == 1:
      return self.requested()
    if multihost_utils.reached_preemption_sync_point(step):
      self.received = self.received or "SIGTERM"
      return True
    return False


def interrupt_now() -> None:
  """Ends the process with one line and EXIT_INTERRUPTED. Not by raising
  KeyboardInterrupt: the handler runs wherever Python next checks for signals, e.g.
  inside XLA's compile call, and unwinding from there while XLA's compiler threads run
  ended in a segmentation fault at exit (jax 0.10, XLA:CPU)."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, RuntimeError):  # closed, or mid-write in this thread
      pass
  os.write(2, b"SIGINT again: stopped at once without saving; rerun the same command to "
              b"resume from the last checkpoint\n")
  os._exit(EXIT_INTERRUPTED)


def full_disk(error: OSError) -> str | None:
  """The line that names a full disk: OutOfSpace's (a checkpoint; also when closing the
  metrics writers failed after it), else the OSError's; None if the disk is not full.
  train.py prints it and exits EXIT_PREEMPTED: the run resumes once there is space."""
  cause = error
  while cause is not None:
    if isinstance(cause, OutOfSpace):
      return str(cause)
    cause = cause.__cause__ or cause.__context__
  return f"out of space: {error}" if is_out_of_space(error) else None
