"""Errors every layer shares: a user's error, a step no older one cures, a full disk, an
error in one line.

The ground floor: imports nothing of the package, so storage (io/), the libraries and the
command-line tools (cli.py) all read them from here.
"""

from __future__ import annotations

import errno


class UserError(Exception):
  """An error in what the user passed."""


class NotDamaged(ValueError):
  """A step that does not restore for a reason no older step cures (the target asked for,
  or the run itself, not damaged files): RunDir.newest_restorable raises it at once."""


def is_out_of_space(error: BaseException | None) -> bool:
  """Whether `error` (or an error it was raised from) is a full disk: errno ENOSPC, or
  tensorstore's "No space left" text (a RESOURCE_EXHAUSTED status; not out of memory)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if getattr(error, "errno", None) == errno.ENOSPC:
      return True
    text = str(error)
    lower = text.lower()  # XLA:TPU's out of memory names a "memory space hbm": not a disk
    if "No space left" in text or ("RESOURCE_EXHAUSTED" in text and "space" in lower
                                   and "out of memory" not in lower):
      return True
    error = error.__cause__ or error.__context__
  return False


def first_line(error: BaseException, limit: int = 300) -> str:
  """"TypeName: the first line of its message" (cut at `limit`): an error in a warning
  or a list of failures."""
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:limit] if text else ''}"
