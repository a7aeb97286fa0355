"""CKA between the layers of one model, and between the layers of two models.

  rep = compare.run((cfg, params, tok), None, dataset, "out/")                # within A
  rep = compare.run((cfg, params, tok), (cfg_b, params_b, tok_b), dataset, "out/")

Both models pool the same items (words or sentences; `features.extract`) of the same data,
so row m of every layer is one item. Two models must share a tokenizer (vocabulary and
pipeline, by `token_ids.tokenizer_digest`) and keep the same items after truncation.
Linear CKA (`similarity.cka`) uses every item; RBF CKA and the unbiased estimator build
[N, N] kernels, once per layer, on GRAM_ROWS sampled items (the same for all layers).
Writes out_dir/report.json (key `similarity`) and heat maps; `summary` prints it.
"""

from __future__ import annotations

import pathlib
import time

import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.data.token_ids import tokenizer_digest
from jaxencoder.probing import features as features_lib
from jaxencoder.probing import images, probe_report, similarity
from jaxencoder.probing.study import StudyOptions, model_summary

GRAM_ROWS = 2048  # items kept for [N, N] kernels: 32 MiB each, one per layer and model


def run(model_a, model_b, dataset, out_dir, options: StudyOptions = StudyOptions(), *,
        unbiased: bool = False, sources=("", None)) -> dict:
  """Layer-by-layer CKA of model A (and A against B); writes report.json and heat maps.
  `model_a`, `model_b`: (cfg, params, tokenizer); `model_b` None compares A with itself."""
  started = time.time()
  if model_b is not None:
    check_same_tokenizer(model_a[2], model_b[2], sources)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  feats_a = _features(*model_a, dataset, options)
  feats_b = None if model_b is None else _features(*model_b, dataset, options)
  if feats_b is not None:
    check_same_items(feats_a, feats_b, sources)
  rep = {"source": sources[0], "data_source": getattr(dataset, "origin", ""),
         "data": feats_a.info,
         "models": {"a": model_summary(model_a[0]),
                    "b": None if model_b is None else model_summary(model_b[0])},
         "extract_seconds": time.time() - started}
  layers_b = None if feats_b is None else feats_b.layers
  pairs = f"{len(feats_a.layers)} x {len(layers_b or feats_a.layers)} layers"
  with progress_lib.phase(f"CKA of {pairs} and plots", enabled=options.progress):
    rep["similarity"] = similarity_report(feats_a.layers, layers_b, unbiased=unbiased,
                                          sources=sources, seed=options.probe.seed)
    rep["plots"] = [str(p) for p in _plots(rep["similarity"], out_dir,
                                           rep["data_source"] or "?")]
  rep["seconds"] = time.time() - started
  probe_report.write_json(rep, out_dir / "report.json")
  return rep


def check_same_tokenizer(tokenizer_a, tokenizer_b, sources) -> None:
  """ValueError (one line, naming both sources) unless both tokenizers map text to the same
  ids: the same vocabulary and the same normaliser, pre-tokeniser and template."""
  if tokenizer_a is None or tokenizer_b is None:  # image encoders: no tokenizer to agree on
    return
  digest_a, digest_b = tokenizer_digest(tokenizer_a), tokenizer_digest(tokenizer_b)
  if digest_a == digest_b:
    return
  same_vocab = tokenizer_a.hf.get_vocab() == tokenizer_b.hf.get_vocab()
  describe = lambda tok, digest: (f"{tok.kind}, {tok.vocab_size} tokens, "
                                  f"sha256 {digest[:12]}")
  raise ValueError(
      f"--similarity needs one tokenizer for both models: {sources[0]} has "
      f"{describe(tokenizer_a, digest_a)}; {sources[1]} has {describe(tokenizer_b, digest_b)}"
      + (" (same vocabulary, another normaliser, pre-tokeniser or template)"
         if same_vocab else ""))


def check_same_items(feats_a, feats_b, sources) -> None:
  """ValueError unless both models pooled the same items (truncation can drop words)."""
  if np.array_equal(feats_a.sentence_ids_M, feats_b.sentence_ids_M):
    return
  raise ValueError(
      f"--similarity compares the same items in both models: {sources[0]} keeps "
      f"{len(feats_a.sentence_ids_M)}, {sources[1]} keeps {len(feats_b.sentence_ids_M)} "
      "(truncated differently: pass a --max-length both models fit)")


def similarity_report(layers_a, layers_b=None, *, unbiased: bool = False,
                      sources=("", None), seed: int = 0) -> dict:
  """Linear and RBF CKA matrices. `linear_cka`: A x B when B is given, else A x A
  (row and column 0: the embeddings)."""
  within_a = _linear(layers_a, None, unbiased, seed)
  rep = {"sources": {"a": sources[0], "b": sources[1]},
         "kernel_estimator": "unbiased" if unbiased else "biased",
         "items": len(layers_a[0]), "within_a": within_a}
  keep = _gram_rows(len(layers_a[0]), seed)
  rep["linear_rows"] = len(keep) if unbiased else len(layers_a[0])
  grams_a = _grams(layers_a, "rbf", keep)
  rbf = {"within_a": _gram_cka(grams_a, None, unbiased), "rows": len(keep),
         "sigma": "median pairwise distance"}
  if layers_b is None:
    rep["linear_cka"] = within_a
    rbf["cka"] = rbf["within_a"]
  else:
    rep["linear_cka"] = _linear(layers_a, layers_b, unbiased, seed)
    rep["within_b"] = _linear(layers_b, None, unbiased, seed)
    grams_b = _grams(layers_b, "rbf", keep)
    rbf["cka"] = _gram_cka(grams_a, grams_b, unbiased)
    rbf["within_b"] = _gram_cka(grams_b, None, unbiased)
  rep["rbf_cka"] = rbf
  return rep


def _linear(layers_a, layers_b, unbiased: bool, seed: int) -> np.ndarray:
  """[A, B] linear CKA: from the features over all items (biased), else from kernels."""
  if not unbiased:  # every item, from the features (memmapped layers read in chunks)
    return similarity.layer_cka(layers_a, layers_b)
  keep = _gram_rows(len(layers_a[0]), seed)
  grams_a = _grams(layers_a, "linear", keep)
  return _gram_cka(grams_a, None if layers_b is None else _grams(layers_b, "linear", keep),
                   unbiased=True)


def _gram_rows(n: int, seed: int) -> np.ndarray:
  """The items the [N, N] kernels keep: all, or GRAM_ROWS of them as `similarity.cka`
  samples (so each entry equals cka(x, y, kernel, max_rows=GRAM_ROWS, seed=seed))."""
  if n <= GRAM_ROWS:
    return np.arange(n)
  return np.sort(np.random.default_rng(seed).choice(n, GRAM_ROWS, replace=False))


def _grams(layers, kernel: str, keep: np.ndarray) -> list[np.ndarray]:
  return [similarity.gram(np.asarray(x_NxP)[keep], kernel) for x_NxP in layers]


def _gram_cka(grams_a, grams_b, unbiased: bool) -> np.ndarray:
  """[A, B] CKA from kernels made once per layer; grams_b None: A with itself (symmetric)."""
  same = grams_b is None
  grams_b = grams_a if same else grams_b
  self_a = [similarity.hsic(k, k, unbiased) for k in grams_a]
  self_b = self_a if same else [similarity.hsic(k, k, unbiased) for k in grams_b]
  out_AxB = np.zeros((len(grams_a), len(grams_b)))
  for i, k_NxN in enumerate(grams_a):
    for j, l_NxN in enumerate(grams_b):
      if same and j < i:
        out_AxB[i, j] = out_AxB[j, i]
        continue
      scale = np.sqrt(self_a[i] * self_b[j]) if self_a[i] > 0 and self_b[j] > 0 else 0.0
      out_AxB[i, j] = similarity.hsic(k_NxN, l_NxN, unbiased) / scale if scale else 0.0
  return out_AxB


def _features(cfg, params, tokenizer, dataset, options: StudyOptions):
  """Pooled features of every layer (no attention statistics: CKA needs none)."""
  if dataset.level == "image":
    return images.extract(cfg, params, dataset, norm=options.image_norm, pool=options.pool,
                          batch_size=options.batch_size, attention=False,
                          progress=options.progress)
  return features_lib.extract(cfg, params, tokenizer, dataset, pool=options.pool,
                              batch_size=options.batch_size, max_length=options.max_length,
                              progress=options.progress,
                              extractor=features_lib.Extractor(cfg, params, attention=False))


def _plots(sim: dict, out_dir: pathlib.Path, data: str = "?") -> list[pathlib.Path]:
  """Heat maps: A against B (when given), then A and B each against itself; the titles
  name the models (A, B) and the data."""
  name_a = f"A ({_short(sim['sources']['a'] or 'model A')})"
  name_b = f"B ({_short(sim['sources']['b'] or 'model B')})"
  title = f"linear CKA ({sim['kernel_estimator']}), data: {_short(data)}\n"
  paths = []
  if "within_b" in sim:
    paths.append(plot_cka(sim["linear_cka"], out_dir / "cka_a_vs_b.png",
                          f"{title}A against B", name_a, name_b))
  paths.append(plot_cka(sim["within_a"], out_dir / "cka_within_a.png", f"{title}A with itself",
                        name_a, name_a))
  if "within_b" in sim:
    paths.append(plot_cka(sim["within_b"], out_dir / "cka_within_b.png",
                          f"{title}B with itself", name_b, name_b))
  return paths


def plot_cka(values_AxB, path, title: str, rows_name: str, columns_name: str
             ) -> pathlib.Path:
  """A layer x layer heat map on the 0..1 scale, each cell's value written in it."""
  values_AxB = np.asarray(values_AxB, np.float64)
  rows, columns = values_AxB.shape
  fig, ax = probe_report.subplots(figsize=(0.6 * columns + 2.5, 0.5 * rows + 1.8))
  image = ax.imshow(values_AxB, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
  for i in range(rows):
    for j in range(columns):
      ax.text(j, i, f"{values_AxB[i, j]:.2f}", ha="center", va="center", fontsize=7,
              color="k" if values_AxB[i, j] > 0.6 else "w")
  ax.set(xlabel=f"layer of {columns_name}\n(0 = embeddings)",
         ylabel=f"layer of {rows_name}\n(0 = embeddings)", title=title,
         xticks=range(columns), yticks=range(rows))
  fig.colorbar(image, ax=ax, label="CKA")
  return probe_report.save_figure(fig, path)


def _short(source: str, width: int = 28) -> str:
  """A source path's last two parts, cut from the left to `width` characters."""
  label = "/".join(pathlib.PurePath(source).parts[-2:])
  return label if len(label) <= width else "…" + label[-(width - 1):]


def summary(rep: dict) -> str:
  """Plain text: per layer i of A, CKA with layer i of B (linear, RBF) and with layer
  i + 1 of A; "-" where there is no such layer."""
  sim = rep["similarity"]
  within_a, has_b = np.asarray(sim["within_a"]), "within_b" in sim
  cka_AxB, rbf_AxB = np.asarray(sim["linear_cka"]), np.asarray(sim["rbf_cka"]["cka"])
  lines = [f"CKA ({sim['kernel_estimator']} HSIC) of {sim['items']} {rep['data']['level']}s "
           f"(linear: {sim['linear_rows']}, RBF: {sim['rbf_cka']['rows']} of them); "
           f"A = {sim['sources']['a']}" + (f", B = {sim['sources']['b']}" if has_b else "")]
  lines.append("layer  " + ("A_i:B_i  rbf_A_i:B_i  " if has_b else "") + "A_i:A_i+1")
  cell = lambda m, i, j: f"{m[i, j]:.4f}" if i < m.shape[0] and j < m.shape[1] else "-"
  for i in range(within_a.shape[0]):
    pair = f"{cell(cka_AxB, i, i):>7}  {cell(rbf_AxB, i, i):>11}  " if has_b else ""
    lines.append(f"{i:5d}  {pair}{cell(within_a, i, i + 1):>9}")
  return "\n".join(lines)
