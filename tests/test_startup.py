"""Time to first step: the persistent compilation cache and the startup timings."""

import logging
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import train_helpers as th
from conftest import CACHE_DIR
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder.train.compilation_cache import default_dir, resolve_dir, use_compilation_cache
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics

TESTS = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  assert default_dir({"JAXENCODER_CACHE_DIR": "/c/jx", "XDG_CACHE_HOME": "/x"}) == "/c/jx"
  assert default_dir({"XDG_CACHE_HOME": "/x"}) == "/x/jaxencoder/xla"
  monkeypatch.setenv("HOME", str(tmp_path))
  assert default_dir({}) == str(tmp_path / ".cache" / "jaxencoder" / "xla")
  assert resolve_dir("", {"XDG_CACHE_HOME": "/x"}) == "/x/jaxencoder/xla"


def test_a_named_dir_is_absolute_none_is_off_and_only_gs_urls_pass(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert resolve_dir("cache") == str(tmp_path / "cache")
  assert resolve_dir("none") is None and resolve_dir("None") is None
  assert resolve_dir("gs://bucket/xla") == "gs://bucket/xla"
  with pytest.raises(ValueError, match="compilation_cache_dir='s3://b/x': only local paths"):
    resolve_dir("s3://b/x")


def test_a_cache_dir_configured_through_jax_is_kept(caplog):
  assert jax.config.jax_compilation_cache_dir == CACHE_DIR  # conftest's
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    assert use_compilation_cache("") == CACHE_DIR
    assert use_compilation_cache("/elsewhere") == CACHE_DIR
  assert jax.config.jax_compilation_cache_dir == CACHE_DIR
  assert "compilation_cache_dir=/elsewhere not applied" in caplog.text


@pytest.fixture
def jax_without_cache():
  """JAX with no cache directory configured (conftest's restored afterwards)."""
  from jax.experimental.compilation_cache import compilation_cache
  saved = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", None)
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_compilation_cache_dir", saved)
  compilation_cache.reset_cache()


def cache_files(path: pathlib.Path) -> list[str]:
  return sorted(p.name for p in path.glob("*-cache")) if path.is_dir() else []


def test_the_default_dir_receives_compiled_programs(jax_without_cache, monkeypatch, tmp_path):
  monkeypatch.delenv("JAXENCODER_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert use_compilation_cache("") == str(tmp_path / "jaxencoder" / "xla")
  jax.jit(lambda x: x * 3.0 + 17.0)(jax.numpy.ones(5))  # conftest: cache every compile
  assert cache_files(tmp_path / "jaxencoder" / "xla")


def test_compilation_cache_dir_none_leaves_the_cache_off(jax_without_cache, monkeypatch,
                                                          tmp_path, caplog):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    assert use_compilation_cache("none") is None
  assert jax.config.jax_compilation_cache_dir is None
  assert "compilation cache: off (compilation_cache_dir=none)" in caplog.text


def test_a_gs_cache_dir_is_written_in_the_bucket(jax_without_cache, gcs):
  assert use_compilation_cache(gcs.url("xla")) == gcs.url("xla")
  jax.jit(lambda x: x * 5.0 - 2.0)(jax.numpy.ones(5))
  assert any(name.endswith("-cache") for name in gcs.objects("xla/"))


RUN = """
import logging, sys, pathlib
logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("jaxencoder").setLevel(logging.INFO)
sys.path.insert(0, {tests!r})
import train_helpers as th
from jaxencoder.train.loop import train_and_evaluate
root = pathlib.Path({root!r})
config = th.tiny_config(root, {source!r}, pathlib.Path({vocab!r}), num_layers=1)
config.num_train_steps, config.optim.total_steps = 1, 4
config.compilation_cache_dir = {cache!r}
train_and_evaluate(config, {workdir!r})
"""


@pytest.mark.slow
def test_a_training_run_caches_its_programs_in_compilation_cache_dir(corpus, tmp_path):
  """A fresh process without JAX's own setting (conftest's removed): a 1-step run on
  1 device."""
  root, source, vocab = corpus
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  code = RUN.format(tests=str(TESTS), root=str(root), source=source, vocab=str(vocab),
                    cache=str(tmp_path / "xla"), workdir=str(tmp_path / "run"))
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"compilation cache: {tmp_path / 'xla'}\n" in result.stderr
  names = cache_files(tmp_path / "xla")
  assert len(names) >= 3, names  # state init, train step, eval step (at least)


@pytest.mark.slow
def test_setup_and_compile_seconds_are_logged_and_written_once(corpus, tmp_path, caplog):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.optim.total_steps = 2, 4
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    train_and_evaluate(config, tmp_path)
    config.num_train_steps = 4
    train_and_evaluate(config, tmp_path)  # resumes at step 2
  pattern = (r"setup [\d.]+ s \(state {} [\d.]+ s\), first step compiled in [\d.]+ s "
             r"\(tracing [\d.]+ s\)")
  assert re.search(pattern.format("init"), caplog.text)
  assert re.search(pattern.format("restore"), caplog.text)
  rows = [r for r in read_metrics(tmp_path) if r["split"] == "startup"]
  assert [r["step"] for r in rows] == [1, 3]  # the first step of each process
  for row in rows:
    assert 0 < row["state_init_s"] < row["setup_s"] and 0 < row["trace_s"] < row["compile_s"]
