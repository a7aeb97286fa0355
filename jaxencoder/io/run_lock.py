"""One trainer per run directory: WORKDIR/lock.json names the trainer that holds it.

Two trainers on one workdir would each take it for a fresh run and overwrite the
other's checkpoints and metrics. A trainer takes the lock before it writes anything:
created exclusively (local: a hard link, which fails if the name exists; gs://: an
upload with ifGenerationMatch=0), refreshed by a heartbeat thread, deleted when training
ends (only while it is still ours). A lock whose holder is gone (a pid that no longer
runs on this host, or no heartbeat for `timeout_s`) is taken over with a warning. A
heartbeat ahead of this host's clock (the clocks disagree) is refused naming the skew and
how to take over. Reading a run (eval-only, predict) takes no lock.

  {"host": "h", "pid": 123, "started": 1.7e9, "heartbeat": 1.7e9, "token": "..."}
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import fsspec

from jaxencoder.errors import UserError
from jaxencoder.io.paths import as_path, is_url, make_dirs

LOCK = "lock.json"
TIMEOUT_S = 600.0  # no heartbeat for this long: the holder is gone
HEARTBEAT_S = 30.0
SKEW_S = 60.0  # a heartbeat further ahead of this host's clock: the two clocks disagree
log = logging.getLogger("jaxencoder")


class RunDirLockedError(UserError):
  """Another trainer holds the run directory."""


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lock: host, pid, start and last heartbeat (seconds since the epoch)."""
  host: str
  pid: int
  started: float
  heartbeat: float
  token: str  # tells this holder from a later one of the same host and pid

  @classmethod
  def me(cls, token: str, started: float) -> "Holder":
    return cls(socket.gethostname(), os.getpid(), started, time.time(), token)

  def describe(self, now: float) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
    age = now - self.heartbeat
    beat = (f"{-age:.0f} s in the future" if self.ahead(now) else f"{max(age, 0):.0f} s ago")
    return f"host {self.host}, pid {self.pid}, started {started}, last heartbeat {beat}"

  def ahead(self, now: float) -> bool:
    """Whether the heartbeat is ahead of `now` by more than SKEW_S: written by a clock
    that disagrees with this host's, it cannot go stale until this clock catches up."""
    return self.heartbeat - now > SKEW_S

  def gone(self, now: float, timeout_s: float) -> str | None:
    """Why this holder no longer runs, or None if it may."""
    if self.host == socket.gethostname() and not _pid_runs(self.pid):
      return f"pid {self.pid} no longer runs on this host"
    if now - self.heartbeat > timeout_s:
      return f"no heartbeat for {now - self.heartbeat:.0f} s (lock_timeout_s={timeout_s:g})"
    return None


class RunLock:
  """The lock of one run directory; `acquire` raises RunDirLockedError naming the holder."""

  def __init__(self, workdir, timeout_s: float = TIMEOUT_S,
               heartbeat_s: float | None = None):
    if not timeout_s > 0:
      raise ValueError(f"lock_timeout_s must be positive, got {timeout_s}")
    self.workdir = as_path(workdir)
    self.path = self.workdir / LOCK
    self.timeout_s = timeout_s
    self.heartbeat_s = heartbeat_s or min(HEARTBEAT_S, timeout_s / 4)
    self._store = _UrlStore(str(self.path)) if is_url(self.path) else _LocalStore(str(self.path))
    self._token = uuid.uuid4().hex
    self._started = time.time()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def acquire(self) -> None:
    """Takes the lock (creating the workdir), else raises; starts the heartbeat."""
    make_dirs(self.workdir)
    for _ in range(3):  # a lost race for a stale lock: look again
      if self._store.create(self._record()):
        self._start_heartbeat()
        return
      holder = self.holder()
      if holder is None:
        continue  # released meanwhile
      now = time.time()
      reason = holder.gone(now, self.timeout_s)
      if reason is None:
        raise RunDirLockedError(self._refusal(holder, now))
      if self.holder() == holder:  # still the stale one, not a newer holder
        self._store.delete()
        log.warning("%s: took over the lock of a trainer that is gone (%s): %s",
                    self.workdir, holder.describe(now), reason)
    raise RunDirLockedError(f"{self.path}: other trainers keep taking this lock; "
                            "use another --workdir")

  def _refusal(self, holder: Holder, now: float) -> str:
    """Who holds the lock, and what to do; a heartbeat from the future names the skew."""
    if not holder.ahead(now):
      return (f"{self.workdir} is in use by another trainer ({holder.describe(now)}); "
              "wait for it, or use another --workdir")
    return (f"{self.workdir} is locked by host {holder.host}, pid {holder.pid}, whose last "
            f"heartbeat is {holder.heartbeat - now:.0f} s ahead of this host's clock: the "
            "clocks disagree, so the lock does not go stale (lock_timeout_s) until this one "
            f"catches up; if no trainer runs as pid {holder.pid} on {holder.host}, delete "
            f"{self.path} and rerun, else wait for it or use another --workdir")

  def holder(self) -> Holder | None:
    """The lock's holder; None without a lock. An unreadable lock counts as one held
    since its file was last written (it goes stale after timeout_s)."""
    text = self._store.read()
    if text is None:
      return None
    try:
      return Holder(**json.loads(text))
    except (ValueError, TypeError):
      written = self._store.modified()
      return Holder("unknown (unreadable lock.json)", -1, written, written, "")

  def held(self) -> bool:
    holder = self.holder()
    return holder is not None and holder.token == self._token

  def release(self) -> bool:
    """Stops the heartbeat; deletes the lock if it is still ours. True if it was."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if not self.held():
      return False
    self._store.delete()
    return True

  def _record(self) -> str:
    return json.dumps(dataclasses.asdict(Holder.me(self._token, self._started)))

  def _start_heartbeat(self) -> None:
    self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        if not self.held():
          log.warning("%s: %s no longer holds this trainer's lock; another trainer may "
                      "write this run directory", self.workdir, LOCK)
          return
        self._store.replace(self._record())
      except OSError as e:  # a network blip: the next beat tries again
        log.warning("%s: lock heartbeat failed: %s", self.path, e)

  def __enter__(self) -> "RunLock":
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


@contextlib.contextmanager
def hold(workdir, timeout_s: float = TIMEOUT_S, *, leader: bool = True,
         share: Callable[[str | None], str | None] = lambda error: error) -> Iterator[None]:
  """Holds the run directory's lock meanwhile: one lock for a multi-process job.

  Only the `leader` (process 0) takes it; `share` passes the leader's refusal (or None)
  to every process, so all of them fail alike.
  """
  lock = RunLock(workdir, timeout_s) if leader else None
  refusal = None
  if lock is not None:
    try:
      lock.acquire()
    except Exception as e:  # every process must hear of it, not wait for the leader
      refusal = str(e)
      share(refusal)
      raise
  refusal = share(refusal)
  if refusal is not None:
    raise RunDirLockedError(refusal)
  try:
    yield
  finally:
    if lock is not None:
      lock.release()


def _pid_runs(pid: int) -> bool:
  """Whether process `pid` runs on this host (a zombie, dead but not reaped, does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    return True
  try:
    with open(f"/proc/{pid}/stat") as stat:
      return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True


class _LocalStore:
  """lock.json on local disk. Created complete and exclusively (written to a temporary
  file, then hard-linked: fails if the name exists), so no reader sees half a lock."""

  def __init__(self, path: str):
    self.path = path

  def create(self, text: str) -> bool:
    temporary = self._write_temporary(text)
    try:
      os.link(temporary, self.path)
      return True
    except FileExistsError:
      return False
    finally:
      os.unlink(temporary)

  def replace(self, text: str) -> None:
    os.replace(self._write_temporary(text), self.path)

  def read(self) -> str | None:
    try:
      with open(self.path, encoding="utf-8") as f:
        return f.read()
    except FileNotFoundError:
      return None

  def modified(self) -> float:
    return os.stat(self.path).st_mtime

  def delete(self) -> None:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(self.path)

  def _write_temporary(self, text: str) -> str:
    temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
      os.write(fd, text.encode())
      os.fsync(fd)
    finally:
      os.close(fd)
    return temporary


class _UrlStore:
  """lock.json in an object store through fsspec (gcsfs for gs://): created with
  ifGenerationMatch=0, which the store refuses (412) if the object exists."""

  def __init__(self, url: str):
    self.fs, self.path = fsspec.core.url_to_fs(url)

  def create(self, text: str) -> bool:
    try:
      self.fs.pipe_file(self.path, text.encode(), mode="create")
      return True
    except FileExistsError:
      return False

  def replace(self, text: str) -> None:
    self.fs.pipe_file(self.path, text.encode())

  def read(self) -> str | None:
    try:
      return self.fs.cat_file(self.path).decode()
    except FileNotFoundError:
      return None

  def modified(self) -> float:
    return self.fs.modified(self.path).timestamp()

  def delete(self) -> None:
    with contextlib.suppress(FileNotFoundError):
      self.fs.rm_file(self.path)
