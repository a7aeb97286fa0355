"""The tools print their own lines only: reading a checkpoint gives orbax nothing to warn
about, and the libraries' remaining chatter is hidden unless asked for (-v or
JAXENCODER_VERBOSE=1); real errors still show."""

import logging
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from jaxencoder import Encoder, cli
from jaxencoder.model.config import EncoderConfig
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained import save
from jaxencoder.pretrained.__main__ import main as convert_main
from jaxencoder.model.restore_targets import encoder_params, restore_encoder, stored_config

ABSL_LINE = re.compile(r"^[IWEF]\d{4} ")  # absl's own format: I0101 12:00:00.000 ...


@pytest.fixture
def restored_logging(monkeypatch):
  """quiet_library_logs changes process-wide logging: put it back afterwards."""
  for name in cli.LIBRARY_LOGGERS:
    logger = logging.getLogger(name)
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "filters", list(logger.filters))
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  for name in ("TF_CPP_MIN_LOG_LEVEL", "GRPC_VERBOSITY"):
    monkeypatch.delenv(name, raising=False)


def tiny_hf_dir(path):
  cfg = EncoderConfig.preset("tiny", vocab_size=64, num_layers=2, pooler_dense=True)
  params = Encoder(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  save(path, cfg, nn.meta.unbox(params))
  return path


def library_lines(text: str) -> list[str]:
  return [line for line in text.splitlines()
          if ABSL_LINE.match(line) or "orbax" in line.lower() or "absl" in line.lower()]


def test_convert_both_ways_prints_only_its_own_lines(tmp_path, capfd, caplog, monkeypatch,
                                                     restored_logging):
  """With every library log shown (verbose), still nothing: the causes are gone."""
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")
  hf = tiny_hf_dir(tmp_path / "hf")
  capfd.readouterr()
  with caplog.at_level(logging.WARNING):
    convert_main(["--from", str(hf), "--to", str(tmp_path / "run")])
    convert_main(["--from", str(tmp_path / "run"), "--to", str(tmp_path / "hf2")])
  out, err = capfd.readouterr()
  assert [line.split(" ")[:3] for line in out.splitlines()] == [
      ["wrote", "jaxencoder", "checkpoint"], ["wrote", "Hugging", "Face"]]
  assert library_lines(out + err) == [] and err == ""
  assert [r.getMessage() for r in caplog.records if r.name == "absl"] == []


def test_reading_a_run_read_only_gives_orbax_nothing_to_warn_about(tmp_path, capfd, caplog,
                                                                   monkeypatch,
                                                                   restored_logging):
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")
  convert_main(["--from", str(tiny_hf_dir(tmp_path / "hf")), "--to", str(tmp_path / "run")])
  capfd.readouterr()
  with caplog.at_level(logging.WARNING):
    run = RunDir.open(tmp_path / "run")
    assert run.read_config()["model"]["num_layers"] == 2
    assert run.param_names() == {"encoder"}
    params = restore_encoder(run, encoder_params(stored_config(run)))
    assert set(params) == {"embeddings", "layers_0", "layers_1", "pooler"}
    reader = Checkpointer(run.checkpoint_dir, save_interval_steps=1, max_to_keep=None,
                          read_only=True)
    assert reader.all_steps() == [0]
  out, err = capfd.readouterr()
  assert (out, err) == ("", "")
  assert [r.getMessage() for r in caplog.records] == []


def test_quiet_hides_library_warnings_and_keeps_errors_and_our_own(caplog, monkeypatch,
                                                                   restored_logging):
  monkeypatch.delenv("JAXENCODER_VERBOSE", raising=False)
  cli.quiet_library_logs()
  cli.quiet_library_logs()  # twice changes nothing
  assert logging.getLogger("absl").filters.count(cli._not_out_of_space) == 1
  with caplog.at_level(logging.INFO):
    logging.getLogger("absl").warning("a library's warning")
    logging.getLogger("absl").info("a library's info")
    logging.getLogger("absl").error("a library's error")
    logging.getLogger("jaxencoder").warning("our own warning")
  assert [r.getMessage() for r in caplog.records] == ["a library's error", "our own warning"]


def test_verbose_keeps_every_library_line(caplog, monkeypatch, restored_logging):
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")
  cli.quiet_library_logs()
  with caplog.at_level(logging.INFO):
    logging.getLogger("absl").info("a library's info")
  assert [r.getMessage() for r in caplog.records] == ["a library's info"]


def test_the_verbose_flag_sets_the_environment(monkeypatch):
  import argparse
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")  # recorded, so the flag's setting is undone
  monkeypatch.delenv("JAXENCODER_VERBOSE")
  parser = argparse.ArgumentParser()
  cli.add_verbose_flag(parser)
  assert parser.parse_args([]).verbose is None and not cli.verbose()
  assert parser.parse_args(["-v"]).verbose is True and cli.verbose()
