"""The persistent XLA compilation cache for training (`config.compilation_cache_dir`).

A rerun, a resumed run or another run of the same shapes loads its compiled programs
from disk instead of compiling them again. JAX's own setting wins: a cache directory
configured through JAX (JAX_COMPILATION_CACHE_DIR, `jax.config.update`) is kept. JAX
reads and writes the cache through etils.epath, so a gs:// directory works too.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

import jax

from jaxencoder.io.paths import is_url

log = logging.getLogger("jaxencoder")

OFF = "none"
_applied = None  # the directory this module gave JAX


def default_dir(environ: Mapping[str, str] = os.environ) -> str:
  """$JAXENCODER_CACHE_DIR, else $XDG_CACHE_HOME/jaxencoder/xla, else
  ~/.cache/jaxencoder/xla."""
  if environ.get("JAXENCODER_CACHE_DIR"):
    return resolve_dir(environ["JAXENCODER_CACHE_DIR"], environ)
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.abspath(os.path.join(base, "jaxencoder", "xla"))


def resolve_dir(value: str, environ: Mapping[str, str] = os.environ) -> str | None:
  """The directory `compilation_cache_dir=value` names: "" the default, "none" None."""
  if value.lower() == OFF:
    return None
  if not value:
    return default_dir(environ)
  if is_url(value):
    if not value.startswith("gs://"):
      raise ValueError(f"compilation_cache_dir={value!r}: only local paths and gs:// are "
                       "supported")
    return value
  return os.path.abspath(os.path.expanduser(value))


def use_compilation_cache(value: str) -> str | None:
  """Points JAX's persistent cache at `value`'s directory (before the first compile)
  unless JAX has one already; logs and returns the directory in use (None: off)."""
  global _applied
  configured = jax.config.jax_compilation_cache_dir
  if configured:
    if resolve_dir(value) == configured:
      log.info("compilation cache: %s", configured)
    else:  # JAX keeps the directory it was given first
      source = ("an earlier run in this process" if configured == _applied
                else "JAX's own setting (JAX_COMPILATION_CACHE_DIR)")
      log.log(logging.WARNING if value else logging.INFO, "compilation cache: %s, from %s%s",
              configured, source, f"; compilation_cache_dir={value} not applied" if value else "")
    return configured
  path = resolve_dir(value)
  if path is None:
    log.info("compilation cache: off (compilation_cache_dir=none)")
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  _applied = path
  log.info("compilation cache: %s", path)
  return path
