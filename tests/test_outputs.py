"""No command destroys what it reads: convert, export, predict and probe refuse an output
that is, contains or lies inside an input, and --overwrite replaces only their own output."""

import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder import Encoder, pretrained
from jaxencoder.export import __main__ as export_cli
from jaxencoder.io import outputs
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained import __main__ as convert_cli
from jaxencoder.probing import __main__ as probe_cli
from jaxencoder.model.restore_targets import write_encoder
from jaxencoder.train import predict


@pytest.fixture(scope="module")
def tiny():
  cfg = tiny_config(vocab_size=len(VOCAB))
  ids = np.ones((1, 8), np.int32)
  return cfg, nn.meta.unbox(jax.jit(Encoder(cfg).init)(jax.random.key(0), ids)["params"])


@pytest.fixture
def runs(tmp_path, tiny):
  """runs/r (a run with its tokenizer and a metrics.jsonl) beside runs/sibling."""
  for name in ("r", "sibling"):
    write_encoder(RunDir(tmp_path / "runs" / name), *tiny, tiny_tokenizer())
    (tmp_path / "runs" / name / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
  return tmp_path / "runs"


def snapshot(root: pathlib.Path) -> dict[str, bytes]:
  """Every file under `root` and its bytes."""
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file()}


def refused(main, argv, capsys) -> str:
  """The one error line of `main(argv)`, which must exit 2."""
  with pytest.raises(SystemExit) as exit_info:
    main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "\n" not in err, err
  return err


# --- convert ----------------------------------------------------------------------------
@pytest.mark.parametrize("to, overwrite, relation", [
    ("r", False, "is"), ("r", True, "is"), (".", True, "contains"),
    ("r/hf", False, "lies inside"), ("r/checkpoints", True, "lies inside")])
def test_convert_refuses_a_target_overlapping_the_run(runs, capsys, to, overwrite, relation):
  before = snapshot(runs)
  argv = ["--from", str(runs / "r"), "--to", str(runs / to)] + ["--overwrite"] * overwrite
  err = refused(convert_cli.main, argv, capsys)
  assert f"--to {runs / to} {relation} --from {runs / 'r'}," in err
  assert snapshot(runs) == before  # the run and its sibling intact, nothing added


def test_convert_refuses_a_hugging_face_directory_onto_itself(tmp_path, tiny, capsys):
  pretrained.save(tmp_path / "hf", *tiny, tiny_tokenizer())
  before = snapshot(tmp_path)
  argv = ["--from", str(tmp_path / "hf"), "--to", str(tmp_path / "hf"), "--overwrite"]
  err = refused(convert_cli.main, argv, capsys)
  assert f"--to {tmp_path / 'hf'} is --from {tmp_path / 'hf'}," in err
  assert snapshot(tmp_path) == before


def test_convert_overwrite_refuses_a_directory_it_did_not_write(runs, tmp_path, capsys):
  other = tmp_path / "notes"
  other.mkdir()
  (other / "todo.txt").write_text("keep me")
  before = snapshot(tmp_path)
  err = refused(convert_cli.main, ["--from", str(runs / "r"), "--to", str(other),
                                   "--overwrite"], capsys)
  assert f"--to {other} is not empty and was not written by jaxencoder-convert" in err
  assert snapshot(tmp_path) == before


def test_convert_overwrite_replaces_its_own_output_but_not_one_with_files_added(
    runs, tmp_path, capsys):
  argv = ["--from", str(runs / "r"), "--to", str(tmp_path / "hf")]
  convert_cli.main(argv)
  marker = json.loads((tmp_path / "hf" / outputs.MARKER).read_text())
  assert marker["tool"] == "jaxencoder-convert" and "config.json" in marker["files"]
  err = refused(convert_cli.main, argv, capsys)  # without --overwrite: pointed to it
  assert "is not empty; choose a new --to or pass --overwrite" in err
  convert_cli.main(argv + ["--overwrite"])
  assert "wrote Hugging Face BERT directory" in capsys.readouterr().out
  (tmp_path / "hf" / "mine.txt").write_text("added by hand")
  before = snapshot(tmp_path)
  err = refused(convert_cli.main, argv + ["--overwrite"], capsys)
  assert "holds mine.txt, which jaxencoder-convert did not write" in err
  assert snapshot(tmp_path) == before


def test_convert_refuses_a_target_holding_the_runs_tokenizer(tmp_path, tiny, capsys):
  tok = tmp_path / "tok"
  tok.mkdir()
  (tok / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  run = write_run(tmp_path / "run", tiny, tok / "vocab.txt")
  before = snapshot(tmp_path)
  err = refused(convert_cli.main, ["--from", str(run), "--to", str(tok)], capsys)
  assert f"--to {tok} contains --from's tokenizer {tok / 'vocab.txt'}," in err
  assert snapshot(tmp_path) == before


def write_run(path, tiny, vocab):
  """A train.py-style run whose data.tokenizer is `vocab` (outside the run)."""
  cfg, params = tiny
  with Checkpointer(path / "checkpoints", save_interval_steps=1, max_to_keep=None) as ckpt:
    ckpt.save(1, {"params": {"encoder": params}}, force=True,
              config={"model": cfg.to_dict(), "data": {"tokenizer": str(vocab), "seq_len": 16}})
    ckpt.wait()
  return path


# --- export -----------------------------------------------------------------------------
@pytest.mark.parametrize("flag, out, relation", [
    ("--run", "r", "is"), ("--run", "r/export", "lies inside"), ("--run", ".", "contains"),
    ("--pretrained", "hf", "is"), ("--pretrained", "hf/export", "lies inside")])
def test_export_refuses_an_out_overlapping_its_source(runs, tiny, capsys, flag, out, relation):
  pretrained.save(runs / "hf", *tiny, tiny_tokenizer())
  source = runs / ("r" if flag == "--run" else "hf")
  before = snapshot(runs)
  err = refused(export_cli.main, [flag, str(source), "--out", str(runs / out), "--overwrite"],
                capsys)
  assert f"--out {runs / out} {relation} {flag} {source}," in err
  assert snapshot(runs) == before


def test_export_overwrite_replaces_its_own_output_only(runs, tmp_path, capsys):
  argv = ["--run", str(runs / "r"), "--out", str(tmp_path / "exported"), "--no-check"]
  export_cli.main(argv)
  export_cli.main(argv + ["--overwrite"])
  assert "wrote" in capsys.readouterr().out
  assert json.loads((tmp_path / "exported" / outputs.MARKER).read_text())["tool"] == \
      "jaxencoder-export"
  before = snapshot(runs)
  err = refused(export_cli.main, ["--run", str(runs / "r"), "--out", str(runs / "sibling"),
                                  "--overwrite", "--no-check"], capsys)  # a run, not an export
  assert f"--out {runs / 'sibling'} is not empty and was not written by jaxencoder-export" in err
  assert snapshot(runs) == before


# --- predict ----------------------------------------------------------------------------
@pytest.mark.parametrize("out", ["input", "metrics", "run"])
def test_predict_refuses_an_out_that_is_its_input_or_in_the_run(runs, tmp_path, capsys, out):
  lines = tmp_path / "lines.txt"
  lines.write_text("a b\nc d\n")
  path = {"input": lines, "metrics": runs / "r" / "metrics.jsonl", "run": runs / "r"}[out]
  before = snapshot(tmp_path)
  err = refused(predict.main, ["--run", str(runs / "r"), "--input", str(lines),
                               "--out", str(path)], capsys)
  source = "--input" if out == "input" else "--run"
  relation = "lies inside" if out == "metrics" else "is"
  assert f"--out {path} {relation} {source} " in err
  assert snapshot(tmp_path) == before


# --- probe ------------------------------------------------------------------------------
@pytest.mark.parametrize("out, relation, source", [
    ("runs/r", "is", "--checkpoint"), ("runs/r/probe", "lies inside", "--checkpoint"),
    ("runs", "contains", "--checkpoint"), ("tagged.txt", "is", "--data")])
def test_probe_refuses_an_out_overlapping_its_inputs(runs, tmp_path, capsys, out, relation,
                                                     source):
  (tmp_path / "tagged.txt").write_text("the/DET cat/NOUN\n")
  before = snapshot(tmp_path)
  err = refused(probe_cli.main, ["--checkpoint", str(runs / "r"), "--data",
                                 str(tmp_path / "tagged.txt"), "--out", str(tmp_path / out)],
                capsys)
  assert f"--out {tmp_path / out} {relation} {source} " in err
  assert snapshot(tmp_path) == before


def probe_argv(runs, tmp_path, *flags) -> list[str]:
  data = tmp_path / "tagged.txt"
  data.write_text("".join(f"the/DET cat/NOUN {'sat/VERB' if i % 2 else 'ran/VERB'}\n"
                          for i in range(30)))
  return ["--checkpoint", str(runs / "r"), "--data", str(data), "--out",
          str(tmp_path / "probe"), "--max-epochs", "1", "--no-control", *flags]


def test_probe_replaces_its_earlier_study_only_with_overwrite_and_wholly(runs, tmp_path,
                                                                        capsys):
  probe_cli.main(probe_argv(runs, tmp_path, "--mlp"))  # an MLP probe: probe_mlp.png
  out = tmp_path / "probe"
  assert (out / "probe_mlp.png").exists()
  capsys.readouterr()
  argv = probe_argv(runs, tmp_path)
  before = snapshot(tmp_path)
  err = refused(probe_cli.main, argv, capsys)
  assert err == (f"error: {out} is not empty; choose a new --out or pass --overwrite (it "
                 "holds an earlier jaxencoder-probe output)")
  assert snapshot(tmp_path) == before
  report = probe_cli.main(probe_argv(runs, tmp_path, "--overwrite"))
  marker = json.loads((out / outputs.MARKER).read_text())
  assert marker["tool"] == "jaxencoder-probe"
  assert sorted(p.name for p in out.iterdir()) == sorted(marker["files"] + [outputs.MARKER])
  assert not (out / "probe_mlp.png").exists() and "mlp" not in report["probes"]
  assert sorted(f"probe/{name}" for name in marker["files"]) == sorted(
      str(pathlib.Path(p).relative_to(tmp_path)) for p in report["plots"] + [out / "report.json"])


@pytest.mark.parametrize("overwrite", [False, True])
def test_probe_never_replaces_a_folder_it_did_not_write(runs, tmp_path, capsys, overwrite):
  out = tmp_path / "probe"
  out.mkdir()
  (out / "notes.txt").write_text("keep me")
  argv = probe_argv(runs, tmp_path, *["--overwrite"] * overwrite)
  before = snapshot(tmp_path)
  err = refused(probe_cli.main, argv, capsys)
  assert err == (f"error: --out {out} is not empty and was not written by jaxencoder-probe "
                 f"(no {outputs.MARKER}), so it is never replaced (not even with --overwrite); "
                 "choose a new --out")
  assert snapshot(tmp_path) == before


def test_a_failed_write_puts_the_earlier_output_back(tmp_path):
  out = tmp_path / "out"
  with outputs.replacing("--out", out, "a-tool", overwrite=False) as new:
    (new / "old.txt").write_text("earlier")
  earlier = snapshot(tmp_path)
  with pytest.raises(RuntimeError, match="study failed"):
    with outputs.replacing("--out", out, "a-tool", overwrite=True) as new:
      (new / "partial.txt").write_text("half")
      raise RuntimeError("study failed")
  assert snapshot(tmp_path) == earlier and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
  with outputs.replacing("--out", out, "a-tool", overwrite=True) as new:
    (new / "new.txt").write_text("later")
  assert sorted(p.name for p in out.iterdir()) == [outputs.MARKER, "new.txt"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing set aside is left


def test_a_failed_write_into_an_empty_folder_leaves_it_empty(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(RuntimeError):
    with outputs.replacing("--out", tmp_path / "empty", "a-tool", overwrite=False) as new:
      (new / "partial.txt").write_text("half")
      raise RuntimeError("study failed")
  assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


# --- the helper -------------------------------------------------------------------------
def test_overlap_is_decided_on_resolved_paths_and_urls_by_name(tmp_path):
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "real")
  with pytest.raises(ValueError, match="is --run"):
    outputs.check_apart(("--out", tmp_path / "link"), [("--run", tmp_path / "real")])
  outputs.check_apart(("--out", tmp_path / "real2"), [("--run", tmp_path / "real")])
  with pytest.raises(ValueError, match="contains --run gs://b/runs/r"):
    outputs.check_apart(("--out", "gs://b/runs/"), [("--run", "gs://b/runs/r")])
  outputs.check_apart(("--out", "gs://c/runs"), [("--run", "gs://b/runs/r"),
                                                 ("--data", None)])
