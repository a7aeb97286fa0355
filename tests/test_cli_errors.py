"""A wrong name on the command line is one line naming the closest right ones, exit 2;
and the tools' small answers (a text's tokens, where MiniLM lives)."""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

from jaxencoder import cli
from jaxencoder.aot.__main__ import main as compile_main
from jaxencoder.pretrained.__main__ import main as convert_main
from jaxencoder.tokenizer import main as tokenizer_main
from jaxencoder.train import stop
from jaxencoder.train.__main__ import main as train_main
from jaxencoder.train.config import base_config, override_model

REPO = pathlib.Path(__file__).resolve().parents[1]
LIST_KEYS = "(see every key: jaxencoder-train --config FILE --print_config)"


@pytest.fixture(autouse=True)
def no_global_changes(monkeypatch):
  """The mains quiet the libraries and arm Ctrl-C handling for the whole process."""
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")
  monkeypatch.setattr(stop, "exit_on_second_interrupt", stop.exit_on_second_interrupt)
  monkeypatch.chdir(REPO)


def one_error_line(capsys, main, argv) -> str:
  with pytest.raises(SystemExit) as exit_:
    main(argv)
  assert exit_.value.code == cli.EXIT_USER_ERROR
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1, err
  return err.strip()


# ------------------------------------------------------------------ did you mean
def test_a_misspelt_dotted_key_names_the_one_it_meant():
  keys = ["optim.learning_rate", "optim.warmup_steps", "data.seq_len", "batch_size"]
  assert cli.did_you_mean("optim.learnin_rate", keys) == "did you mean optim.learning_rate?"


def test_a_leaf_without_its_section_or_as_initials_finds_the_full_key():
  keys = ["optim.learning_rate", "data.seq_len", "model.num_layers"]
  assert cli.did_you_mean("seq_len", keys) == "did you mean data.seq_len?"
  assert cli.did_you_mean("optim.lr", keys) == "did you mean optim.learning_rate?"


def test_several_close_names_are_listed_up_to_three_and_none_gives_nothing():
  names = ["emb_dim", "image_size", "vocab_size", "num_heads"]
  assert cli.did_you_mean("emb_size", names) == "did you mean emb_dim, image_size or vocab_size?"
  assert cli.did_you_mean("xyz", names) == ""


# ------------------------------------------------------------------ each tool
def test_train_names_the_closest_config_key(capsys, tmp_path):
  err = one_error_line(capsys, train_main, ["--config", "configs/mlm_tiny.py", "--workdir",
                                            str(tmp_path), "--config.optim.learnin_rate=1"])
  assert err == ("error: unknown config key 'optim.learnin_rate'; did you mean "
                 f"optim.learning_rate? {LIST_KEYS}")


@pytest.mark.parametrize("override, allowed", [
    ("optim.learning_rate=-1", "a number > 0"), ("optim.learning_rate=0", "a number > 0"),
    ("optim.warmup_steps=-5", "an integer >= 0"), ("optim.weight_decay=-1", "a number >= 0"),
    ("optim.grad_clip_norm=-1", "a number >= 0"), ("optim.grad_accum_steps=0", "an integer >= 1")])
def test_train_refuses_a_value_that_cannot_be_right_before_the_workdir_exists(
    capsys, tmp_path, override, allowed):
  workdir = tmp_path / "run"
  err = one_error_line(capsys, train_main, ["--config", "configs/mlm_tiny.py", "--workdir",
                                            str(workdir), f"--config.{override}"])
  key = override.split("=")[0]
  assert err.startswith(f"error: {key}=") and f"cannot be right: it must be {allowed}" in err
  assert not workdir.exists()


@pytest.mark.parametrize("body, said", [
    ("return None", "get_config() returned None (no return?), not an ml_collections.ConfigDict"),
    ("pass", "get_config() returned None (no return?), not an ml_collections.ConfigDict"),
    ("return {'batch_size': 8}", "get_config() returned a dict, not an ml_collections.ConfigDict"),
    ("return [1]", "get_config() returned a list, not an ml_collections.ConfigDict")])
def test_train_refuses_a_get_config_that_returns_no_configdict_before_the_workdir_exists(
    capsys, tmp_path, body, said):
  config = tmp_path / "bad.py"
  config.write_text(f"def get_config():\n  {body}\n")
  workdir = tmp_path / "runs" / "run"
  err = one_error_line(capsys, train_main, ["--config", str(config), "--workdir", str(workdir)])
  assert err == (f"error: --config {config}: {said}; return one, e.g. base_config() from "
                 "jaxencoder.train.config with the keys it changes")
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("main, flags", [(train_main, ["--workdir", "WORKDIR"]),
                                         (compile_main, ["--topology", "v5e-8"])])
def test_a_get_config_that_raises_is_one_line_naming_the_file_line_and_error(
    capsys, tmp_path, main, flags):
  config = tmp_path / "bad.py"
  config.write_text("def get_config():\n  raise RuntimeError('no such machine\\nmore')\n")
  workdir = tmp_path / "run"
  argv = ["--config", str(config), *[str(workdir) if f == "WORKDIR" else f for f in flags]]
  assert one_error_line(capsys, main, argv) == (
      f"error: --config {config}:2: RuntimeError: no such machine")
  assert not workdir.exists()


def test_a_variant_that_returns_a_dict_is_named_with_its_argument(tmp_path):
  from jaxencoder.train.config_file import load_config
  config = tmp_path / "variants.py"
  config.write_text("def get_config(arg=''):\n  return dict(arg=arg)\n")
  with pytest.raises(cli.UserError, match=r"^--config .*variants.py: get_config\('cpu'\) "
                                          r"returned a dict, not an ml_collections.ConfigDict"):
    load_config(f"{config}:cpu")


@pytest.mark.parametrize("flags, line", [
    (["--config.batch_size=10"], "batch_size=10 does not divide over 8 data-parallel devices "
     "(mesh data=8); use batch_size=8 or 16"),
    (["--eval_only", "--config.eval_batch_size=12"], "eval_batch_size=12 does not divide over 8 "
     "data-parallel devices (mesh data=8); use eval_batch_size=8 or 16")])
def test_train_refuses_a_batch_the_devices_do_not_divide_before_the_workdir_exists(
    capsys, tmp_path, flags, line):
  workdir = tmp_path / "run"
  err = one_error_line(capsys, train_main, ["--config", "configs/mlm_tiny.py", "--workdir",
                                            str(workdir), *flags])
  assert err == f"error: {line}"
  assert not workdir.exists()


def test_override_model_names_the_closest_fields():
  with pytest.raises(KeyError) as error:
    override_model(base_config(), emb_size=48)
  assert error.value.args[0] == ("unknown model field 'emb_size'; did you mean emb_dim, "
                                 f"image_size or vocab_size? {LIST_KEYS}")


def test_print_config_lists_every_key_with_the_overrides(capsys):
  train_main(["--config", "configs/mlm_tiny.py", "--print_config",
              "--config.optim.learning_rate=0.25"])
  out = capsys.readouterr().out
  assert "learning_rate: 0.25" in out and "seq_len:" in out and "num_layers:" in out


def test_compile_names_the_closest_topologies(capsys):
  err = one_error_line(capsys, compile_main, ["--config", "configs/mlm_tiny.py",
                                              "--topology", "v5f-8"])
  assert err.startswith("error: unknown topology 'v5f-8': did you mean v5e-8 or v5p-8? "
                        "use a Cloud TPU type: v4-8")


def test_convert_names_the_closest_model_family(capsys, tmp_path):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "robrta"}))
  err = one_error_line(capsys, convert_main, ["--from", str(tmp_path / "hf"),
                                              "--to", str(tmp_path / "run")])
  assert err == (f"error: {tmp_path / 'hf' / 'config.json'}: model_type='robrta' is not "
                 "supported; did you mean roberta? supported: ['bert', 'distilbert', "
                 "'electra', 'modernbert', 'roberta', 'vit']")


def test_convert_where_names_the_closest_checkpoint_name(capsys):
  err = one_error_line(capsys, convert_main, ["--where", "minlm"])
  assert err == "error: unknown checkpoint name 'minlm'; did you mean minilm? (named: minilm)"


def test_tokenizer_names_the_bundled_one_for_a_close_name(capsys):
  err = one_error_line(capsys, tokenizer_main, ["encode", "hello", "--tokenizer", "minlm"])
  assert err == ("error: unknown tokenizer 'minlm'; did you mean minilm? (no such file or "
                 "directory; pass a vocab.txt, tokenizer.json, a directory holding one, or "
                 "minilm)")


# ------------------------------------------------------------------ small answers
def test_tokenizer_encode_prints_id_and_piece_of_each_token(capsys):
  tokenizer_main(["encode", "hello"])
  assert capsys.readouterr().out == "101\t[CLS]\n7592\thello\n102\t[SEP]\n"


def test_tokenizer_encode_reads_a_tokenizer_directory(capsys, tmp_path):
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhe\n##llo\n")
  tokenizer_main(["encode", "Hello", "--tokenizer", str(tmp_path)])
  assert capsys.readouterr().out == "2\t[CLS]\n5\the\n6\t##llo\n3\t[SEP]\n"


def test_convert_where_prints_the_minilm_model_directory(capsys):
  convert_main(["--where", "minilm"])
  path = pathlib.Path(capsys.readouterr().out.strip())
  assert path.name == "model" and (path / "model.safetensors").is_file()
  assert (path / "config.json").is_file()


# ------------------------------------------------------------------ the JAX backend
NO_CUDA = not (cli._has_nvidia_gpu() and cli._has_cuda_plugin())


@pytest.mark.skipif(not NO_CUDA, reason="this host runs CUDA: JAX_PLATFORMS=cuda starts")
@pytest.mark.parametrize("platforms", ["cuda", "gpu"])
def test_a_gpu_backend_that_cannot_start_is_one_line_naming_the_install(platforms, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "jaxencoder.train", "--config", "configs/mlm_tiny.py",
       "--workdir", str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True,
      env={**os.environ, "JAX_PLATFORMS": platforms, "JAXENCODER_VERBOSE": ""}, timeout=300)
  assert result.returncode == cli.EXIT_USER_ERROR, result.stderr
  assert len(result.stderr.splitlines()) == 1, result.stderr
  assert result.stderr.startswith(f"error: JAX_PLATFORMS={platforms}: ")
  assert "pip install 'jaxencoder[cuda]'" in result.stderr
  assert not (tmp_path / "run").exists()


TPU_BUSY = ("Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process "
            "with pid 4321. Not attempting to load libtpu.so in this process. (set "
            "JAX_PLATFORMS='' to automatically choose an available backend)")


@pytest.mark.parametrize("error, line", [
    (RuntimeError(TPU_BUSY), "JAX_PLATFORMS=tpu: the TPU is held by another process (pid 4321)"
                             ": end it or wait, then rerun; or unset JAX_PLATFORMS to run on the"
                             " CPU"),
    (RuntimeError("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so"),
     "JAX_PLATFORMS=tpu: backend 'tpu' cannot start (INTERNAL: Failed to open libtpu.so): pip "
     "install 'jaxencoder[tpu]'; or unset JAX_PLATFORMS to run on the CPU"),
    (RuntimeError("a bug"), None),
    (AssertionError(), None),  # not raised in JAX's backend start-up
])
def test_backend_failures_are_named_and_other_errors_are_not(error, line, monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert cli.backend_failure(error) == line


def test_run_main_turns_a_backend_failure_into_one_line_and_leaves_a_bug(capsys, monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  def fail(error):
    raise error
  with pytest.raises(SystemExit) as exit_:
    cli.run_main(lambda: fail(RuntimeError(TPU_BUSY)))
  assert exit_.value.code == cli.EXIT_USER_ERROR
  assert capsys.readouterr().err.startswith("error: JAX_PLATFORMS=tpu: the TPU is held by")
  with pytest.raises(RuntimeError, match="a bug"):
    cli.run_main(lambda: fail(RuntimeError("a bug")))


def test_the_backend_line_names_platform_devices_kinds_and_processes(capsys):
  assert cli.log_backend() == "running on cpu: 8 devices"  # conftest's 8 CPU devices
  assert capsys.readouterr().err == "running on cpu: 8 devices\n"  # no log set up: stderr
  tpus = [types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")] * 8
  assert cli.devices_line(tpus, 2) == "running on tpu: 8 devices (TPU v5 lite), 2 processes"
  one = [types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")]
  assert cli.devices_line(one) == "running on gpu: 1 device (NVIDIA H200)"


def test_a_busy_tpu_is_an_error_not_a_quiet_fall_back_to_the_cpu(monkeypatch):
  from jax._src import xla_bridge
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(cli, "has_tpu_chips", lambda: True)
  monkeypatch.setattr(xla_bridge, "_backend_errors", {"tpu": TPU_BUSY.split(": ", 1)[1]})
  with pytest.raises(cli.UserError, match=r"^this host's TPU is held by another process \(pid "
                     r"4321\): end it or wait; or JAX_PLATFORMS=cpu to run on the CPU$"):
    cli.log_backend()
