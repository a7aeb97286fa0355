"""jaxencoder-export: StableHLO and ONNX files that reload and agree with JAX on new shapes."""

import json
import pathlib
import re

import flax.linen as nn
import jax
import numpy as np
import pytest

import train_helpers as th
from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder import Encoder, export
from jaxencoder.export import __main__ as export_cli
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.io import run_record
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.train import loop, predict

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "export.md"
SHAPES = ((2, 8), (3, 13))  # two padded batches, one export
NEEDS_ONNX = "--format onnx needs jax2onnx (pip install --no-deps jax2onnx==0.17.1) and onnxruntime"


def onnx_available() -> bool:
  import importlib.util
  return all(importlib.util.find_spec(m) for m in ("jax2onnx", "onnxruntime"))


onnx_only = pytest.mark.skipif(not onnx_available(), reason=NEEDS_ONNX)
FORMATS = ["stablehlo", pytest.param("onnx", marks=onnx_only)]


def init(model, seed: int = 0):
  ids = np.ones((1, 8), np.int32)
  return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), ids)["params"])


@pytest.fixture(scope="module")
def tiny():
  """A tiny text encoder with type embeddings and mean pooling: (cfg, params)."""
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="mean")
  return cfg, init(Encoder(cfg))


def write_run(path, cfg, params, vocab, **config):
  """A train.py-style run directory holding `params` at step 1."""
  with Checkpointer(path / "checkpoints", save_interval_steps=1, max_to_keep=None) as ckpt:
    ckpt.save(1, {"params": params}, force=True,
              config={"model": cfg.to_dict(), "data": {"tokenizer": str(vocab), "seq_len": 16},
                      **config})
    ckpt.wait()
  return path


def vocab_file(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n")
  return path


def export_to(s, fmt, out):
  out.mkdir(exist_ok=True)
  path = out / export.FILES[fmt]
  (export.export_onnx if fmt == "onnx" else export.export_stablehlo)(s, path)
  return export.runner(fmt, path, s.inputs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_export_matches_jax_on_padded_batches_of_two_shapes(tiny, tmp_path, fmt):
  s = export.servable(*tiny)
  run = export_to(s, fmt, tmp_path)
  for batch, length in SHAPES:
    arrays = export.example_batch(s, batch, length)
    assert arrays[1].min() == 0  # padded
    for name, want, got in zip(s.outputs, jax.jit(s.fn)(*arrays), run(*arrays)):
      assert got.shape == want.shape, name
      np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=name)


def test_the_exported_function_is_the_encoder(tiny):
  cfg, params = tiny
  s = export.servable(cfg, params)
  ids, mask, types = export.example_batch(s, 2, 8)
  out = Encoder(cfg).apply({"params": params}, ids, mask, types)
  hidden, pooled = s.fn(ids, mask, types)
  np.testing.assert_allclose(hidden, out.last_hidden_state, atol=1e-6)
  np.testing.assert_allclose(pooled, out.pooled, atol=1e-6)


def test_cli_exports_a_run_and_a_pretrained_directory(tiny, tmp_path, capsys):
  from jaxencoder import pretrained
  cfg, params = tiny
  run = write_run(tmp_path / "run", cfg, {"encoder": params}, vocab_file(tmp_path))
  pretrained.save(tmp_path / "hf", cfg, params, tiny_tokenizer())
  for flag, source in (("--run", run), ("--pretrained", tmp_path / "hf")):
    out = tmp_path / f"out{flag}"
    export_cli.main([flag, str(source), "--format", "stablehlo", "--out", str(out)])
    said = capsys.readouterr()
    assert "wrote" in said.out and "running on cpu: 8 devices\n" in said.err
    spec = json.loads((out / export.SPEC).read_text())
    assert [i["name"] for i in spec["inputs"]] == ["input_ids", "attention_mask",
                                                    "token_type_ids"]
    assert spec["inputs"][0]["shape"] == ["B", "L"] and spec["max_len"] == cfg.max_len
    assert [(o["name"], o["shape"]) for o in spec["outputs"]] == [
        ("last_hidden_state", ["B", "L", cfg.emb_dim]), ("pooled", ["B", cfg.emb_dim])]
    assert max(spec["check"]["max_abs_diff"].values()) < 1e-4
    assert (out / spec["tokenizer"]).exists() and spec["model"]["emb_dim"] == cfg.emb_dim
    hidden, _ = export.load_exported(out)(*export.example_batch(export.servable(cfg, params), 3, 5))
    assert hidden.shape == (3, 5, cfg.emb_dim)


def test_a_classifier_run_exports_its_head_logits(tiny, tmp_path):
  cfg = tiny[0]
  model = EncoderClassifier(cfg, 3)
  params = init(model, seed=1)
  run = write_run(tmp_path / "run", cfg, params, vocab_file(tmp_path),
                  task="classify", num_classes=3)
  out = tmp_path / "out"
  export_cli.main(["--run", str(run), "--out", str(out), "--no-check"])
  spec = json.loads((out / export.SPEC).read_text())
  assert [(o["name"], o["shape"]) for o in spec["outputs"]] == [("logits", ["B", 3])]
  assert spec["source"]["task"] == "classify"
  arrays = export.example_batch(export.servable(cfg, params["encoder"]), 3, 13)
  (logits,) = export.load_exported(out)(*arrays)
  np.testing.assert_allclose(logits, model.apply({"params": params}, *arrays), atol=1e-4)


def serving_snippet(marker: str) -> str:
  """The ```py block of docs/export.md that holds `marker`, as written there."""
  blocks = [b for b in re.findall(r"```py\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
            if marker in b]
  assert len(blocks) == 1, f"docs/export.md: {len(blocks)} ```py blocks hold {marker!r}"
  return blocks[0]


def serve_as_documented(run, tmp_path, capsys, monkeypatch) -> tuple[str, list[str]]:
  """(What docs/export.md's classifier snippet prints on `run`'s ONNX export, written where
  the docs' command writes it; the labels jaxencoder-predict gives the snippet's texts)."""
  export_cli.main(["--run", str(run), "--format", "onnx", "--out", str(tmp_path / "run_onnx"),
                   "--no-check"])
  capsys.readouterr()
  snippet = serving_snippet("id2label")
  monkeypatch.chdir(tmp_path)
  exec(snippet, {})
  texts = eval(re.search(r"encode_batch\((\[.*?\])\)", snippet).group(1))
  predicted = predict.predict(predict.load(run), texts)
  return capsys.readouterr().out.strip(), [line.split("\t")[0] for line in predicted]


@onnx_only
def test_the_documented_snippet_serves_a_classifier_run_with_its_label_names(
    tiny, tmp_path, capsys, monkeypatch):
  cfg = tiny[0]  # a run as training leaves it: its own tokenizer pads nothing, cuts at 16
  run = write_run(tmp_path / "run", cfg, init(EncoderClassifier(cfg, 2), seed=2),
                  vocab_file(tmp_path), task="classify", num_classes=2)
  tokenizer = tiny_tokenizer()
  tokenizer.encode("a b", max_length=16)
  run_record.write(run, {"tokenizer": {"files": run_record.save_tokenizer(run, tokenizer)},
                         "labels": ["no", "yes"]})
  printed, labels = serve_as_documented(run, tmp_path, capsys, monkeypatch)
  assert printed == repr(labels) and set(labels) <= {"no", "yes"}, printed
  out = tmp_path / "run_onnx"
  spec = json.loads((out / export.SPEC).read_text())
  assert spec["id2label"] == {"0": "no", "1": "yes"} and spec["external_data"] is None
  served = json.loads((out / "tokenizer.json").read_text())
  assert served["padding"]["strategy"] == "BatchLongest"
  assert served["truncation"]["max_length"] == cfg.max_positions
  assert {f.name: oct(f.stat().st_mode & 0o777) for f in out.iterdir()} == {
      name: "0o644" for name in (".jaxencoder-output.json", "export.json", "model.onnx",
                                 "tokenizer.json")}


@onnx_only
def test_weights_past_the_one_file_limit_go_beside_it_named_in_export_json(
    tiny, tmp_path, monkeypatch):
  from jaxencoder.export import formats
  monkeypatch.setattr(formats, "ONNX_ONE_FILE_BYTES", 0)  # as if the model were 2 GB
  run = write_run(tmp_path / "run", tiny[0], {"encoder": tiny[1]}, vocab_file(tmp_path))
  export_cli.main(["--run", str(run), "--format", "onnx", "--out", str(tmp_path / "out")])
  spec = json.loads((tmp_path / "out" / export.SPEC).read_text())
  data = tmp_path / "out" / spec["external_data"]
  assert spec["external_data"] == "model.onnx.data" and data.stat().st_size > 10_000
  assert oct(data.stat().st_mode & 0o777) == "0o644"
  assert max(spec["check"]["max_abs_diff"].values()) < 1e-4  # read with its weights


@pytest.mark.slow
@onnx_only
def test_the_documented_snippet_serves_a_trained_classify_run(tmp_path, capsys, monkeypatch):
  config = th.tiny_config(tmp_path, th.classification_set(tmp_path), th.write_vocab(tmp_path))
  config.task, config.data.kind, config.data.eval_split = "classify", "text_classification", "test"
  config.num_train_steps = config.eval_every = config.checkpoint_every = 2
  loop.train_and_evaluate(config, tmp_path / "run")
  printed, labels = serve_as_documented(tmp_path / "run", tmp_path, capsys, monkeypatch)
  assert printed == repr(labels) and set(labels) <= {"no", "yes"}, printed


def test_longer_than_the_position_table_is_refused(tiny, tmp_path):
  cfg, params = tiny
  s = export.servable(cfg, params)
  export_to(s, "stablehlo", tmp_path)
  (tmp_path / export.SPEC).write_text(json.dumps(export.describe(s, "stablehlo")))
  too_long = export.example_batch(s, 1, cfg.max_len + 1)
  with pytest.raises(ValueError, match=f"sequence length {cfg.max_len + 1} > {cfg.max_len}"):
    export.load_exported(tmp_path)(*too_long)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_host_callback_fails_in_one_line_naming_it(tiny, tmp_path, fmt):
  base = export.servable(*tiny)
  def with_callback(*arrays):
    jax.debug.callback(lambda ids: None, arrays[0])
    return base.fn(*arrays)
  s = export.Servable(with_callback, base.inputs, base.outputs, base.cfg, base.max_len)
  with pytest.raises(export.Unsupported, match=f"^{fmt}: .*debug_callback") as error:
    export_to(s, fmt, tmp_path)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("equation,plan", [
    ("abc,cd->abd", (None, None, None)),  # a dense layer on [B, L, D]
    ("zayb,zyca->zybc", ([0, 2, 3, 1], [0, 1, 3, 2], None)),  # batched, both transposed
    ("bd,dc->cb", (None, None, [1, 0])),
    ("abc,bcd->ad", None),  # two contracted letters: left as an Einsum
    ("abc,cbd->abd", ([1, 0, 2], [1, 0, 2], [1, 0, 2])),  # batch b in the middle
    ("bhqd,bhkd->bhqk", (None, [0, 1, 3, 2], None)),  # attention scores
])
def test_einsums_that_are_matrix_products_become_matmuls(equation, plan):
  from jaxencoder.export.onnx_matmul import matmul_plan
  assert matmul_plan(equation) == plan
  if plan is not None:  # numpy: the transposed MatMul is the einsum
    rng = np.random.default_rng(0)
    a_letters, b_letters = equation.split("->")[0].split(",")
    size = dict(zip("abcdhkqyz", (2, 3, 4, 5, 6, 7, 3, 2, 4)))
    a = rng.normal(size=[size[c] for c in a_letters])
    b = rng.normal(size=[size[c] for c in b_letters])
    tr = lambda x, perm: x if perm is None else x.transpose(perm)
    got = tr(np.matmul(tr(a, plan[0]), tr(b, plan[1])), plan[2])
    np.testing.assert_allclose(got, np.einsum(equation, a, b), atol=1e-12)


@onnx_only
def test_an_op_the_onnx_converter_lacks_fails_in_one_line_naming_it(tiny, tmp_path,
                                                                     monkeypatch):
  from jax2onnx.plugins import plugin_system
  plugin_system.import_all_plugins()
  monkeypatch.delitem(plugin_system.PLUGIN_REGISTRY, "rsqrt")  # layer norm's
  with pytest.raises(export.Unsupported, match="JAX primitive 'rsqrt'") as error:
    export_to(export.servable(*tiny), "onnx", tmp_path)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("args,message", [
    (["--format", "tflite"], "unknown format 'tflite'"),
    (["--run", "A", "--pretrained", "B"], "give one of --run RUN_DIR or --pretrained HF_DIR"),
    ([], "give one of --run RUN_DIR or --pretrained HF_DIR"),
    (["--run", "missing"], "no checkpoint here"),
    (["--pretrained", "missing"], "no config.json there"),
])
def test_bad_arguments_give_one_error_line(tmp_path, capsys, args, message):
  args = [a if a in ("A", "B", "tflite") or a.startswith("--") else str(tmp_path / a)
          for a in args]
  with pytest.raises(SystemExit) as exit_info:
    export_cli.main(args + ["--out", str(tmp_path / "out")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err, err
