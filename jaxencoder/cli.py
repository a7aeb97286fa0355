"""What the command-line tools share: a user error is one line on stderr and exit code 2.

Set JAXENCODER_TRACEBACK=1 to get the traceback instead (for bug reports).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_USER_ERROR = 2  # a bad flag, file or value


class UserError(Exception):
  """An error in what the user passed."""


# Errors that describe bad input rather than a bug (bad values, missing or damaged files).
USER_ERRORS: tuple[type[Exception], ...] = (UserError, KeyError, ValueError, TypeError,
                                            FileNotFoundError, FileExistsError)


def run_main(main: Callable[[], Any], extra_errors: tuple[type[Exception], ...] = ()) -> Any:
  """Calls `main()`; a user error prints `error: ...` and exits with EXIT_USER_ERROR."""
  try:
    return main()
  except USER_ERRORS + extra_errors as e:
    if os.environ.get("JAXENCODER_TRACEBACK"):
      raise
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
