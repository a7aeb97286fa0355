"""CKA between the layers of one model and of two models (probing.compare, --similarity)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder import Encoder
from jaxencoder.probing import compare, similarity
from jaxencoder.probing.study import StudyOptions
from jaxencoder.tokenizer import Tokenizer
from test_probing_cli import tagged_dataset, write_checkpoint

OPTIONS = StudyOptions(batch_size=8, progress=False)


def tiny_model(num_layers: int = 2, seed: int = 0, **overrides):
  fields = {"vocab_size": len(VOCAB), "max_len": 64, "num_layers": num_layers, **overrides}
  cfg = tiny_config(**fields)
  params = jax.jit(Encoder(cfg).init)(jax.random.key(seed), np.ones((1, 8), np.int32))
  return cfg, nn.meta.unbox(params["params"]), tiny_tokenizer()


def with_top_layer_perturbed(model, scale: float = 0.5):
  """The same model with noise added to every weight of its last layer only."""
  cfg, params, tok = model
  top = f"layers_{cfg.num_layers - 1}"
  leaves, tree = jax.tree.flatten(params[top])
  keys = jax.random.split(jax.random.key(1), len(leaves))
  noisy = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return cfg, {**params, top: jax.tree.unflatten(tree, noisy)}, tok


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.fixture(scope="module")
def dataset():
  return tagged_dataset([5 + i % 9 for i in range(24)])  # 24 sentences, one length bucket


@pytest.fixture(scope="module")
def against_itself(model, dataset, tmp_path_factory):
  out = tmp_path_factory.mktemp("itself")
  return out, compare.run(model, model, dataset, out, OPTIONS, sources=("a", "a again"))


def test_a_model_against_itself_has_ones_on_the_diagonal_and_is_symmetric(against_itself):
  _, rep = against_itself
  sim = rep["similarity"]
  for name in ("linear_cka", "within_a", "within_b"):
    cka_AxA = np.asarray(sim[name])
    assert cka_AxA.shape == (3, 3)
    np.testing.assert_allclose(np.diag(cka_AxA), 1.0, atol=1e-6)
    np.testing.assert_allclose(cka_AxA, cka_AxA.T, atol=1e-6)
  np.testing.assert_allclose(np.diag(sim["rbf_cka"]["cka"]), 1.0, atol=1e-6)
  assert sim["items"] == sum(5 + i % 9 for i in range(24))
  assert sim["kernel_estimator"] == "biased"
  assert sim["sources"] == {"a": "a", "b": "a again"}


def test_the_report_and_its_heat_maps_are_written(against_itself):
  out, rep = against_itself
  saved = json.loads((out / "report.json").read_text())
  assert saved["similarity"]["linear_cka"] == pytest.approx(rep["similarity"]["linear_cka"])
  names = sorted(p.rsplit("/", 1)[-1] for p in rep["plots"])
  assert names == ["cka_a_vs_b.png", "cka_within_a.png", "cka_within_b.png"]
  for png in rep["plots"]:
    assert open(png, "rb").read(4) == b"\x89PNG"


def test_one_model_alone_reports_its_layers_against_each_other(model, dataset, tmp_path):
  rep = compare.run(model, None, dataset, tmp_path, OPTIONS, sources=("a", None))
  sim = rep["similarity"]
  assert "within_b" not in sim and sim["sources"] == {"a": "a", "b": None}
  np.testing.assert_array_equal(sim["linear_cka"], sim["within_a"])
  assert [p.rsplit("/", 1)[-1] for p in rep["plots"]] == ["cka_within_a.png"]
  lines = compare.summary(rep).splitlines()
  assert lines[1].split() == ["layer", "A_i:A_i+1"]
  assert [line.split()[1] for line in lines[2:]] == [
      f"{sim['within_a'][0, 1]:.4f}", f"{sim['within_a'][1, 2]:.4f}", "-"]


def test_models_of_different_depth_give_a_layers_a_by_layers_b_matrix(model, dataset,
                                                                      tmp_path):
  deeper = tiny_model(num_layers=3, seed=2)
  sim = compare.run(model, deeper, dataset, tmp_path, OPTIONS,
                    sources=("two", "three"))["similarity"]
  assert np.asarray(sim["linear_cka"]).shape == (3, 4)
  assert np.asarray(sim["rbf_cka"]["cka"]).shape == (3, 4)
  assert np.asarray(sim["within_a"]).shape == (3, 3)
  assert np.asarray(sim["within_b"]).shape == (4, 4)
  assert np.all((np.asarray(sim["linear_cka"]) >= 0) & (np.asarray(sim["linear_cka"]) <= 1))


def test_perturbing_the_top_layer_changes_only_the_top_layers_cka(model, dataset, tmp_path):
  sim = compare.run(model, with_top_layer_perturbed(model), dataset, tmp_path, OPTIONS,
                    sources=("a", "a, top perturbed"))["similarity"]
  diagonal = np.diag(np.asarray(sim["linear_cka"]))
  np.testing.assert_allclose(diagonal[:-1], 1.0, atol=1e-6)  # embeddings, layer 1
  assert diagonal[-1] < 0.99
  rbf_diagonal = np.diag(np.asarray(sim["rbf_cka"]["cka"]))
  np.testing.assert_allclose(rbf_diagonal[:-1], 1.0, atol=1e-6)
  assert rbf_diagonal[-1] < 0.99


def test_cka_matrices_equal_similarity_cka_pair_by_pair(monkeypatch):
  monkeypatch.setattr(similarity, "CHUNK_ROWS", 7)  # the linear products add up 6 chunks
  rng = np.random.default_rng(0)
  layers_a = [rng.normal(size=(40, 6)) for _ in range(3)]
  layers_b = [x @ rng.normal(size=(6, 5)) + 0.3 * rng.normal(size=(40, 5)) for x in layers_a]
  for unbiased in (False, True):
    sim = compare.similarity_report(layers_a, layers_b, unbiased=unbiased)
    pair_by_pair = [[similarity.cka(x, y, unbiased=unbiased) for y in layers_b]
                    for x in layers_a]
    np.testing.assert_allclose(sim["linear_cka"], pair_by_pair, atol=1e-12)
    np.testing.assert_allclose(sim["rbf_cka"]["cka"], similarity.layer_cka(
        layers_a, layers_b, "rbf", unbiased=unbiased), atol=1e-12)
    np.testing.assert_allclose(sim["rbf_cka"]["within_b"], similarity.layer_cka(
        layers_b, None, "rbf", unbiased=unbiased), atol=1e-12)


def test_kernels_keep_the_rows_similarity_cka_samples(monkeypatch):
  monkeypatch.setattr(compare, "GRAM_ROWS", 16)
  rng = np.random.default_rng(1)
  layers = [rng.normal(size=(50, 4)) for _ in range(2)]
  sim = compare.similarity_report(layers, seed=3)
  assert sim["rbf_cka"]["rows"] == 16
  want = similarity.cka(layers[0], layers[1], "rbf", max_rows=16, seed=3)
  assert sim["rbf_cka"]["within_a"][0, 1] == pytest.approx(want, abs=1e-12)


def test_items_kept_differently_by_truncation_are_refused(model, tmp_path):
  short = tiny_model(max_len=8)  # its position table cuts sentences at 8 tokens
  with pytest.raises(ValueError, match=r"^--similarity compares the same items in both "
                                       r"models: long keeps 14, short keeps 10 \("):
    compare.run(model, short, tagged_dataset([10, 4]), tmp_path, OPTIONS,
                sources=("long", "short"))


def write_tagged(path, dataset) -> None:
  path.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                            for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n")


def error_lines(err: str) -> list[str]:
  return [line for line in err.splitlines() if line.startswith("error:")]


def test_models_with_different_tokenizers_are_refused_in_one_line(model, dataset, tmp_path,
                                                                  capsys):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model
  swapped = Tokenizer.from_vocab(VOCAB[:-2] + [VOCAB[-1], VOCAB[-2]])  # two ids exchanged
  pretrained.save(tmp_path / "a", cfg, params, tok)
  pretrained.save(tmp_path / "b", cfg, params, swapped)
  write_tagged(tmp_path / "tags.txt", dataset)
  with pytest.raises(SystemExit) as exit_info:
    probe.main(["--similarity", "--pretrained", str(tmp_path / "a"), "--against",
                str(tmp_path / "b"), "--data", str(tmp_path / "tags.txt"),
                "--out", str(tmp_path / "out")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  [line] = error_lines(err)
  assert line.startswith("error: --similarity needs one tokenizer for both models: ")
  assert f"{tmp_path / 'a'} has wordpiece, {len(VOCAB)} tokens" in line
  assert f"{tmp_path / 'b'} has wordpiece, {len(VOCAB)} tokens" in line
  assert "Traceback" not in err and not (tmp_path / "out" / "report.json").exists()


def test_against_without_similarity_is_refused_in_one_line(tmp_path, capsys):
  from jaxencoder.probing import __main__ as probe
  with pytest.raises(SystemExit) as exit_info:
    probe.main(["--pretrained", str(tmp_path / "a"), "--against", str(tmp_path / "b"),
                "--data", str(tmp_path / "tags.txt"), "--out", str(tmp_path / "out")])
  assert exit_info.value.code == 2
  assert error_lines(capsys.readouterr().err) == [
      "error: --against / --against-checkpoint compare two models: add --similarity"]


def test_cli_compares_a_hugging_face_dir_with_a_checkpoint_and_prints_the_diagonal(
    model, dataset, tmp_path, capsys):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  cfg_b, params_b, _ = with_top_layer_perturbed(model)
  (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  write_checkpoint(tmp_path / "run", cfg_b, params_b, tmp_path / "vocab.txt")
  write_tagged(tmp_path / "tags.txt", dataset)
  rep = probe.main(["--similarity", "--pretrained", str(tmp_path / "hf"),
                    "--against-checkpoint", str(tmp_path / "run"), "--data",
                    str(tmp_path / "tags.txt"), "--out", str(tmp_path / "out"), "--unbiased"])
  assert rep["similarity"]["kernel_estimator"] == "unbiased"
  assert rep["similarity"]["sources"] == {"a": str(tmp_path / "hf"),
                                          "b": str(tmp_path / "run")}
  lines = capsys.readouterr().out.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("layer "))
  assert lines[start].split() == ["layer", "A_i:B_i", "rbf_A_i:B_i", "A_i:A_i+1"]
  rows = [line.split() for line in lines[start + 1:start + 4]]
  assert [row[0] for row in rows] == ["0", "1", "2"]
  assert [row[1] for row in rows[:2]] == ["1.0000", "1.0000"] and float(rows[2][1]) < 0.99
  assert rows[2][3] == "-"  # the top layer has no next one
  assert lines[-1] == f"wrote {tmp_path / 'out' / 'report.json'} and 3 plots"
