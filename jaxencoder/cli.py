"""What the command-line tools share: a user error is one line on stderr and exit code 2
(naming the closest valid names when a name was wrong); so is a JAX backend that cannot
start (its cause and the install command); the libraries' chatter is hidden; the tools
that run JAX say first which backend and devices they run on (log_backend).

Set JAXENCODER_TRACEBACK=1 to get the traceback instead (for bug reports), and
JAXENCODER_VERBOSE=1 (or a tool's -v) to see every library's log lines. Light to import:
no JAX, so that every tool's --help answers at once.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import importlib.metadata
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from typing import Any

# UserError lives on the ground floor (errors.py); the tools raise it as cli.UserError.
from jaxencoder.errors import UserError, is_out_of_space
from jaxencoder.tpu_host import has_tpu_chips

EXIT_USER_ERROR = 2  # a bad flag, file or value

# Errors that describe bad input rather than a bug (bad values, missing or damaged files).
USER_ERRORS: tuple[type[Exception], ...] = (UserError, KeyError, ValueError, TypeError,
                                            FileNotFoundError, FileExistsError)


def run_main(main: Callable[[], Any], extra_errors: tuple[type[Exception], ...] = ()) -> Any:
  """Calls `main()` with the libraries quiet; a user error prints `error: ...` and exits
  with EXIT_USER_ERROR."""
  quiet_library_logs()
  try:
    return main()
  except USER_ERRORS + extra_errors as e:
    if os.environ.get("JAXENCODER_TRACEBACK"):
      raise
    message = e.args[0] if isinstance(e, KeyError) and e.args else e
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
  except (RuntimeError, AssertionError) as e:  # JAX's, when a backend cannot start
    message = backend_failure(e)
    if message is None or os.environ.get("JAXENCODER_TRACEBACK"):
      raise
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


# --- did you mean ----------------------------------------------------------------------
def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
  """"did you mean a, b or c?" naming the (up to) `n` choices closest to `name` (those
  about as close as the closest), or "".

  Dotted names ("optim.learning_rate") are compared whole and by their last part, so a
  misspelt or misplaced leaf is found; a leaf written as initials ("lr") finds its name.
  """
  scores = {}
  for choice in dict.fromkeys(choices):
    score = max(_similarity(name, choice), _similarity(_leaf(name), _leaf(choice)))
    if score >= 0.6:
      scores[choice] = score
  if not scores:
    return ""
  top = max(scores.values())  # only the near-best: a clear match stands alone
  best = sorted((c for c in scores if scores[c] >= top - 0.1), key=lambda c: (-scores[c], c))[:n]
  names = best[0] if len(best) == 1 else f"{', '.join(best[:-1])} or {best[-1]}"
  return f"did you mean {names}?"


def _leaf(name: str) -> str:
  return name.rpartition(".")[2]


def _similarity(a: str, b: str) -> float:
  """difflib's ratio, and 1 when `a` is the initials of `b`'s words (lr: learning_rate)."""
  if len(a) > 1 and a == "".join(word[:1] for word in b.split("_")):
    return 1.0
  return difflib.SequenceMatcher(None, a, b).ratio()


def unknown(what: str, name: str, choices: Iterable[str], hint: str = "") -> str:
  """One line for a name that is not among `choices`: what it is, the closest valid
  names, and `hint` (where to see them all) instead of the whole list."""
  suggestion = did_you_mean(name, choices)
  return (f"unknown {what} {name!r}" + (f"; {suggestion}" if suggestion else "")
          + (f" ({hint})" if hint else ""))


# --- quiet libraries -------------------------------------------------------------------
# Loggers of the libraries whose info and warnings a user cannot act on.
LIBRARY_LOGGERS = ("absl", "orbax", "jax", "tensorflow", "grain", "etils")


def verbose() -> bool:
  return bool(os.environ.get("JAXENCODER_VERBOSE"))


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
  """-v / --verbose: every library's log lines (sets JAXENCODER_VERBOSE=1)."""
  parser.add_argument("-v", "--verbose", action=_Verbose, nargs=0,
                      help="show every library's log lines (also: JAXENCODER_VERBOSE=1)")


class _Verbose(argparse.Action):
  def __call__(self, parser, namespace, values, option_string=None):
    os.environ["JAXENCODER_VERBOSE"] = "1"
    setattr(namespace, self.dest, True)


def quiet_library_logs() -> None:
  """Hides library chatter a user cannot act on (absl / orbax / tfds / grain / jax info
  and warnings); errors still show. Unless verbose(); calling it again changes nothing."""
  if verbose():
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up lines
  os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
  for name in LIBRARY_LOGGERS:
    logging.getLogger(name).setLevel(logging.ERROR)
  absl = logging.getLogger("absl")
  if _not_out_of_space not in absl.filters:
    absl.addFilter(_not_out_of_space)
  if not getattr(sys.unraisablehook, "_jaxencoder_quiet", False):
    sys.unraisablehook = _without_closed_loop(sys.unraisablehook)


def _without_closed_loop(hook):
  """After a failed save, tensorstore's callbacks into orbax's closed event loop each print
  a traceback ('Event loop is closed'); the failure itself is reported."""
  def filtered(unraisable):
    value = unraisable.exc_value
    if not (isinstance(value, RuntimeError) and str(value) == "Event loop is closed"):
      hook(unraisable)
  filtered._jaxencoder_quiet = True
  return filtered


def _not_out_of_space(record: logging.LogRecord) -> bool:
  """Drops orbax's logged tracebacks of a full disk: train.py names it in one line."""
  return not (record.exc_info and is_out_of_space(record.exc_info[1]))


# --- argument types and parsing shared by several tools ---------------------------------
def parse_image_size(text: str) -> tuple[int, int]:
  """"H,W" or "S" (square) -> (H, W); an argparse type (--image_size, --image-size)."""
  try:
    sizes = tuple(int(v) for v in text.replace("x", ",").split(","))
  except ValueError:
    sizes = ()
  if len(sizes) not in (1, 2) or min(sizes) <= 0:
    raise argparse.ArgumentTypeError(f"{text!r}: expected H,W (e.g. 224,224) or one size")
  return (sizes * 2)[:2]


def parse_with_overrides(parser: argparse.ArgumentParser, argv):
  """(args, ['key=value', ...]): the parser's flags and the `--config.key=value` overrides;
  anything else is a usage error."""
  args, rest = parser.parse_known_args(argv)
  overrides = []
  for item in rest:
    if not item.startswith("--config."):
      parser.error(f"unrecognised argument {item!r} (overrides look like --config.key=value)")
    overrides.append(item[len("--config."):])
  return args, overrides


def moved_names(module: str, new_homes: dict[str, str]) -> Callable[[str], Any]:
  """A module's `__getattr__` for names that moved out of it (`new_homes`: name -> its new
  dotted path): importing one fails with one line naming where it lives now."""
  def getattr_(name: str):
    if name in new_homes:
      raise ImportError(f"{module}.{name} moved: use {new_homes[name]}")
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
  getattr_.new_homes = new_homes
  return getattr_


# --- the JAX backend -------------------------------------------------------------------
INSTALL = {"cuda": "pip install 'jaxencoder[cuda]'", "tpu": "pip install 'jaxencoder[tpu]'"}
ON_CPU = "or unset JAX_PLATFORMS to run on the CPU"
log = logging.getLogger("jaxencoder")


def log_backend() -> str:
  """Starts JAX's backend and says what the tool runs on (`running on cpu: 8 devices`,
  `running on tpu: 8 devices (TPU v5 lite)`) in the jaxencoder log, or on stderr where
  the tool logs nothing; returns that line. A host whose TPU or GPU JAX left unused (it
  fell back to the CPU, saying so only in a hidden warning) is a UserError naming why."""
  import jax  # lazy: --help stays fast (cli.py loads no JAX)
  devices = jax.devices()
  if devices[0].platform == "cpu" and not os.environ.get("JAX_PLATFORMS"):
    unused = _unused_accelerator()
    if unused:
      raise UserError(f"{unused}; or JAX_PLATFORMS=cpu to run on the CPU")
  line = devices_line(devices, jax.process_count())
  if log.isEnabledFor(logging.INFO) and logging.getLogger().handlers:
    log.info(line)
  else:
    print(line, file=sys.stderr)
  return line


def devices_line(devices, processes: int = 1) -> str:
  """`running on PLATFORM: N devices (their kinds, but a CPU's)[, P processes]`."""
  platform, count = devices[0].platform, len(devices)
  kinds = sorted({d.device_kind for d in devices})
  return (f"running on {platform}: {count} device{'s' * (count > 1)}"
          + ("" if platform == "cpu" else f" ({', '.join(kinds)})")
          + (f", {processes} processes" if processes > 1 else ""))


def backend_failure(e: BaseException) -> str | None:
  """One line for JAX's error when the backend JAX_PLATFORMS asks for cannot start (its
  cause and the fix); None for any other error."""
  requested = os.environ.get("JAX_PLATFORMS", "")
  where = f"JAX_PLATFORMS={requested}: " if requested else ""
  if isinstance(e, AssertionError):  # jax skips cuda without a visible GPU, then asserts
    return f"{where}no CUDA backend ({_cuda_cause()}): {_cuda_fix()}" if _no_backend() else None
  found = re.match(r"Unable to initialize backend '(\w+)': (.*?)(?: \((?:set JAX_PLATFORMS|"
                   r"you may need).*)?$", str(e), flags=re.DOTALL)
  if not found:
    return None
  platform, detail = found.group(1), " ".join(found.group(2).split())
  if platform == "rocm" and "gpu" in requested.split(","):  # gpu: cuda (skipped), then rocm
    return f"{where}no GPU backend (cuda: {_cuda_cause()}; rocm: not installed): {_cuda_fix()}"
  if platform == "cuda":
    return f"{where}the CUDA backend cannot start ({_short(detail)}): {_cuda_fix()}"
  busy = re.search(r"already in use by process with pid (\d+)", detail)
  if platform == "tpu" and busy:
    return (f"{where}the TPU is held by another process (pid {busy.group(1)}): end it or "
            f"wait, then rerun; {ON_CPU}")
  fix = INSTALL.get(platform, f"install JAX's plugin for {platform!r}")
  return f"{where}backend {platform!r} cannot start ({_short(detail)}): {fix}; {ON_CPU}"


def _no_backend() -> bool:
  """Whether JAX's backend start-up fails with its bare AssertionError (no platform of
  JAX_PLATFORMS started), asked again: the error that reached run_main may have come
  through a jitted call, whose traceback JAX filters."""
  import jax  # lazy: --help stays fast (cli.py loads no JAX)
  try:
    jax.devices()
  except AssertionError as e:
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and frames[-1].filename.endswith("xla_bridge.py")
  return False


def _short(text: str, limit: int = 160) -> str:
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _has_nvidia_gpu() -> bool:
  return bool(glob.glob("/dev/nvidia[0-9]*"))


def _has_cuda_plugin() -> bool:
  try:
    importlib.metadata.version("jax-cuda12-plugin")
    return True
  except importlib.metadata.PackageNotFoundError:
    return False


def _cuda_cause() -> str:
  """Why JAX has no CUDA backend here: no GPU visible, no CUDA plugin, or both."""
  causes = ([] if _has_nvidia_gpu() else ["no NVIDIA GPU is visible"]) + (
      [] if _has_cuda_plugin() else ["this jaxlib has no CUDA plugin"])
  return ", and ".join(causes) or "the CUDA plugin did not start"


def _cuda_fix() -> str:
  install = "" if _has_cuda_plugin() else f"on a GPU host {INSTALL['cuda']}; "
  return install + ON_CPU


def _unused_accelerator() -> str | None:
  """Why JAX chose the CPU on a host with TPU chips or an NVIDIA GPU: its backend failed
  (JAX says so only in a warning, hidden with the library logs), or there is no CUDA
  plugin; None on a host without them."""
  present = {"tpu": has_tpu_chips(), "cuda": _has_nvidia_gpu()}
  if not any(present.values()):
    return None
  from jax._src import xla_bridge  # lazy: --help stays fast (JAX keeps the reasons here)
  errors = getattr(xla_bridge, "_backend_errors", {})
  for platform in (p for p in present if present[p] and errors.get(p)):
    reason = " ".join(errors[platform].split())
    busy = re.search(r"already in use by process with pid (\d+)", reason)
    if busy:
      return f"this host's TPU is held by another process (pid {busy.group(1)}): end it or wait"
    return f"this host's {platform} backend did not start ({_short(reason)})"
  if present["cuda"] and not _has_cuda_plugin():
    return f"this host has an NVIDIA GPU but this jaxlib has no CUDA plugin: {INSTALL['cuda']}"
  return None
