"""What a run checks before it writes anything: values that cannot be right (the
optimizer's, batches the devices do not divide) and a workdir it cannot write."""

from __future__ import annotations

import pathlib
import tempfile

import jax

from jaxencoder import cli
from jaxencoder.train import optim, sharding
from jaxencoder.train.config import check_batches


def check_before_writing(config, *, train: bool = True) -> None:
  """Values that cannot be right, refused before the workdir exists: the optimizer's, and
  batches that the run's devices (config.cpu_devices applied) do not divide."""
  if train:
    optim.check(config.optim)
  sharding.use_cpu_devices(config.cpu_devices)
  check_batches(config, jax.device_count(), train=train)  # the backend starts here
  cli.log_backend()


def check_writable_workdir(workdir: str) -> None:
  """UserError naming a local --workdir that is a file or cannot be written (checked before
  anything is built or compiled); creates it if missing. gs:// paths are not checked."""
  if "://" in workdir:
    return
  path = pathlib.Path(workdir)
  if path.exists() and not path.is_dir():
    raise cli.UserError(f"--workdir {path}: is a file, not a directory; pass a directory "
                        "(a new one is created)")
  for folder in (path, path / "checkpoints"):
    if folder != path and not folder.exists():
      continue  # orbax creates it
    try:
      folder.mkdir(parents=True, exist_ok=True)
      tempfile.TemporaryFile(dir=folder).close()
    except (FileExistsError, NotADirectoryError):
      blocker = next((p for p in (folder, *folder.parents) if p.is_file()), folder)
      raise cli.UserError(f"--workdir {path}: {blocker} is a file, not a directory") from None
    except OSError as e:
      raise cli.UserError(f"--workdir {path}: {folder} is not writable ({e.strerror}); pass a "
                          "writable directory or fix its permissions") from None
