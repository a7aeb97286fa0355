"""An export directory (`jaxencoder-export`'s DIR): the model read from a run directory or
a Hugging Face directory, exported as StableHLO or ONNX, checked against JAX on a padded
batch, described in export.json, with its tokenizer file beside it.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Sequence

from jaxencoder import cli
from jaxencoder import pretrained as hf
from jaxencoder.export import CHECK_SHAPE, FILES, PLATFORMS, SPEC, formats
from jaxencoder.export.formats import Servable
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.io import outputs
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained.hf_checkpoint import encoder_params
from jaxencoder.pretrained.resolver import hf_dir, resolve
from jaxencoder.model.restore_targets import stored_config, stored_encoder
from jaxencoder.tasks import registry
from jaxencoder.tokenizer import Tokenizer, resolve_file, run_tokenizer
from jaxencoder.train import predict

TOOL = "jaxencoder-export"  # named in the marker of what it writes (io.outputs)


def write(out, fmt: str = "stablehlo", *, run: str | None = None,
          pretrained: str | None = None, platforms: Sequence[str] = PLATFORMS,
          check: bool = True, overwrite: bool = False) -> str:
  """Writes DIR `out` from `run` (a run directory) or `pretrained` (a Hugging Face
  directory); returns a one-line summary. `platforms`: StableHLO's; `check`: run the
  export against JAX on a padded batch; `overwrite`: replace a DIR this tool wrote."""
  if fmt not in FILES:
    raise cli.UserError(cli.unknown("format", fmt, FILES, f"formats: {', '.join(FILES)}"))
  if bool(run) == bool(pretrained):
    raise cli.UserError("give one of --run RUN_DIR or --pretrained HF_DIR")
  out = pathlib.Path(out)
  outputs.check_apart(("--out", out), _inputs(run, pretrained))
  outputs.check_replaceable("--out", out, TOOL, overwrite)
  s, tokenizer = read_model(run, pretrained)
  cli.log_backend()  # after the model's own errors (one line each), before its export
  out.mkdir(parents=True, exist_ok=True)
  for stale in out.glob("model.*"):  # --overwrite: no weights of another export stay
    stale.unlink()
  start = time.perf_counter()
  extra = _export(s, fmt, out / FILES[fmt], platforms)
  seconds = time.perf_counter() - start
  extra["export_seconds"] = round(seconds, 2)
  extra["tokenizer"] = write_tokenizer(tokenizer, out, s.cfg.max_positions) if tokenizer else None
  note = ""
  if check:
    diffs = formats.check(s, fmt, out / FILES[fmt])
    extra["check"] = {"shape": list(CHECK_SHAPE), "max_abs_diff": diffs}
    note = f"; max |diff| vs JAX on a padded {CHECK_SHAPE} batch: {max(diffs.values()):.1e}"
  (out / SPEC).write_text(json.dumps(formats.describe(s, fmt, **extra), indent=2) + "\n")
  outputs.mark(out, TOOL)
  readable_by_all(out)
  size = sum(f.stat().st_size for f in out.glob("model.*")) / 2**20
  return (f"wrote {out / FILES[fmt]} ({size:.1f} MiB, {seconds:.1f} s; inputs "
          f"{', '.join(s.inputs)} [B, L] int32 -> {', '.join(s.outputs)}){note}")


def _export(s: Servable, fmt: str, path: pathlib.Path, platforms: Sequence[str]) -> dict:
  """Writes the model file; returns what export.json says of it (ONNX: its external-data
  file or None; StableHLO: the platforms lowered for)."""
  if fmt == "onnx":
    return {"external_data": formats.export_onnx(s, path)}
  formats.export_stablehlo(s, path, tuple(platforms))
  return {"platforms": list(platforms)}


def write_tokenizer(source, out: pathlib.Path, max_len: int) -> str:
  """Writes OUT/tokenizer.json from the model's tokenizer file `source`, padding a batch
  to its longest text and truncating at `max_len` (the model's length) whatever the
  source said, so that encode_batch gives rectangular arrays; returns its name."""
  tok = Tokenizer.from_file(source)  # as training read it (a vocab.txt: uncased BERT)
  try:
    pad_id = tok.pad_id
  except KeyError:  # no pad token: any id serves, the attention mask hides it
    pad_id = 0
  tok.hf.enable_padding(pad_id=pad_id, pad_token=tok.hf.id_to_token(pad_id) or "[PAD]")
  tok.hf.enable_truncation(max_len)
  (out / "tokenizer.json").write_text(tok.hf.to_str(pretty=True), encoding="utf-8")
  return "tokenizer.json"


def readable_by_all(out: pathlib.Path) -> None:
  """Mode 0644 for each file in `out` (onnx writes its external data 0600): an export is
  served by other users and services."""
  for f in out.iterdir():
    if f.is_file():
      f.chmod(0o644)


def _inputs(run: str | None, pretrained: str | None) -> list[outputs.Labelled]:
  """What the export reads: the --pretrained directory, or the --run and its tokenizer."""
  if pretrained:
    return [("--pretrained", pretrained)]
  return outputs.run_inputs("--run", RunDir.open(resolve(run).path))


def read_model(run: str | None, pretrained: str | None) -> tuple[Servable, str | None]:
  """(Servable, tokenizer file or None) of a run directory (or RUN@STEP) or a Hugging Face
  directory (or a registered name), as resolver.resolve reads them."""
  if pretrained:
    pretrained = hf_dir(pretrained, "--pretrained", "--run reads runs")
    if not pathlib.Path(pretrained, "config.json").exists():
      raise FileNotFoundError(f"--pretrained {pretrained}: no config.json there (a Hugging "
                              "Face encoder directory)")
    cfg, params, _ = hf.load(pretrained)
    return (formats.servable(cfg, encoder_params(params), source={"pretrained": pretrained}),
            tokenizer_file(pretrained))
  where = resolve(run)
  run_dir = RunDir.open(where.path)  # the newest step that restores (a damaged one: a warning)
  step, encoder = run_dir.newest_restorable(lambda s: stored_encoder(run_dir, step=s),
                                            where.step)
  config, cfg = run_dir.read_config(step), stored_config(run_dir, step)
  source = {"run": run, "step": step, "task": config.get("task")}
  if classifier_task(config, cfg):
    p = predict.load(where.path, step)  # with its head (the encoder is read again)
    return (formats.servable(p.cfg, p.params, head=p.model, source=source, labels=p.label_names),
            tokenizer_file(run_tokenizer(run_dir)))
  # As jaxencoder-convert: a converted directory without tokenizer files gets none.
  has_tokenizer = run_dir.tokenizer_path() or "data" in config
  tokenizer = tokenizer_file(run_tokenizer(run_dir)) if has_tokenizer else None
  return formats.servable(cfg, encoder, source=source), tokenizer


def tokenizer_file(path) -> str | None:
  """The tokenizer file at `path` (the file, or the one a directory holds, as the
  Tokenizer reads it); None if there is none."""
  try:
    return str(resolve_file(path))
  except FileNotFoundError:
    return None


def classifier_task(config: dict, cfg) -> bool:
  """Whether a run trained an EncoderClassifier (its head's logits are exported)."""
  if "task" not in config or cfg.input_kind != "text":
    return False
  task = registry.task_from_config(config, cfg, num_classes=config.get("num_classes", 2))
  return isinstance(task.model, EncoderClassifier)
