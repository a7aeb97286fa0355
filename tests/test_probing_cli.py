"""Feature extraction on a tiny encoder (buckets, pooling, streaming) and the probe CLI."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, WORDS, tiny_tokenizer
from jaxencoder import Encoder
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.probing import features

TAGS = {w: ("DET" if w in ("the", "a", "an") else "NOUN" if i % 2 else "VERB")
        for i, w in enumerate(WORDS)}


@pytest.fixture(scope="module")
def model():
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  params = jax.jit(Encoder(cfg).init)(jax.random.key(0), np.ones((1, 8), np.int32))["params"]
  params = nn.meta.unbox(params)  # as train.py checkpoints store them
  return cfg, params, tiny_tokenizer()


@pytest.fixture(scope="module")
def apply(model):
  """The tiny encoder's apply, jitted (one compile beats eager op-by-op dispatch)."""
  cfg = model[0]
  jitted = jax.jit(Encoder(cfg).apply, static_argnames=("output_hidden_states",))
  return lambda params, ids, **kw: jitted({"params": params}, ids, **kw)


def tagged_dataset(lengths, seed: int = 0) -> features.Dataset:
  rng = np.random.default_rng(seed)
  words = [list(rng.choice(WORDS, size=n)) for n in lengths]
  return features.Dataset("word", words, [[TAGS[w] for w in s] for s in words])


def test_extraction_compiles_once_per_bucket_across_many_lengths(model):
  cfg, params, tok = model
  dataset = tagged_dataset(range(1, 50))  # 49 lengths, 3 + 1 .. 3 + 49 tokens
  feats = features.extract(cfg, params, tok, dataset, batch_size=4, max_length=64)
  buckets_used = {features.bucket_for(n + 2, (16, 32, 64)) for n in range(1, 50)}
  assert feats.info["buckets"] == [16, 32, 64]
  assert feats.info["compiles"] == len(buckets_used) == 3
  assert len(feats.layers) == cfg.num_layers + 1
  assert feats.layers[0].shape == (sum(range(1, 50)), cfg.emb_dim)


def test_word_features_equal_unpadded_hidden_states_at_first_subword(model, apply):
  cfg, params, tok = model
  dataset = tagged_dataset([3, 9, 5, 14])
  feats = features.extract(cfg, params, tok, dataset, batch_size=3)
  s = 2  # the third sentence: its items follow those of sentences 0 and 1
  enc = tok.encode(dataset.sentences[s], is_pretokenized=True)
  out = apply(params, enc["input_ids"][None], output_hidden_states=True)
  first_W = enc["first_subword_index"]
  start = 3 + 9
  for n, h_1xLxD in enumerate(out.hidden_states):
    np.testing.assert_allclose(feats.layers[n][start:start + 5], h_1xLxD[0, first_W],
                               atol=1e-5)
  assert feats.types[start:start + 5] == dataset.sentences[s]
  assert list(feats.sentence_ids_M[start:start + 5]) == [s] * 5


def test_sentence_cls_features_equal_position_zero(model, apply):
  cfg, params, tok = model
  dataset = features.Dataset("sentence", ["the cat sat", "a dog ran far away"], ["x", "y"])
  feats = features.extract(cfg, params, tok, dataset, batch_size=2)
  enc = tok.encode("a dog ran far away")
  out = apply(params, enc["input_ids"][None], output_hidden_states=True)
  np.testing.assert_allclose(feats.layers[-1][1], out.hidden_states[-1][0, 0], atol=1e-5)
  assert list(feats.labels_M) == [0, 1] and feats.label_names == ["x", "y"]


def test_streamed_features_are_npy_memmaps_equal_to_in_memory_ones(model, tmp_path):
  cfg, params, tok = model
  dataset = tagged_dataset([4, 7, 2])
  in_memory = features.extract(cfg, params, tok, dataset, pool="mean", batch_size=2)
  streamed = features.extract(cfg, params, tok, dataset, pool="mean", batch_size=2,
                              out_dir=tmp_path)
  for n in range(cfg.num_layers + 1):
    on_disk = np.load(tmp_path / f"layer_{n:02d}.npy", mmap_mode="r")
    np.testing.assert_array_equal(on_disk, in_memory.layers[n])
    np.testing.assert_array_equal(streamed.layers[n], in_memory.layers[n])
  loaded = features.load_features(tmp_path)
  np.testing.assert_array_equal(loaded.layers[-1], in_memory.layers[-1])
  np.testing.assert_array_equal(loaded.labels_M, in_memory.labels_M)
  assert loaded.types == in_memory.types and loaded.label_names == in_memory.label_names
  np.testing.assert_allclose(loaded.attention["entropy"], in_memory.attention["entropy"])


def test_read_dataset_picks_the_level_from_the_file_kind(tmp_path):
  (tmp_path / "s.csv").write_text("text,label\nthe cat sat,pos\na dog ran,neg\n")
  conllu = "1\tthe\t_\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t0\troot\t_\t_\n"
  (tmp_path / "t.conllu").write_text(conllu + "\n")
  sentences = features.read_dataset(tmp_path / "s.csv")
  words = features.read_dataset(tmp_path / "t.conllu")
  assert (sentences.level, sentences.labels) == ("sentence", ["pos", "neg"])
  assert (words.level, words.sentences, words.labels) == ("word", [["the", "cat"]],
                                                         [["DET", "NOUN"]])


def write_checkpoint(workdir, cfg, params, vocab_path):
  """A train.py-style workdir: checkpoints/<step> (state + config) and metrics.jsonl."""
  with Checkpointer(workdir / "checkpoints", save_interval_steps=1, max_to_keep=1) as ckpt:
    ckpt.save(3, {"params": {"encoder": params}}, force=True,
              config={"model": cfg.to_dict(), "data": {"tokenizer": str(vocab_path)}})
    ckpt.wait()
  lines = [{"step": s, "split": "train", "loss": 3.0 - 0.1 * s} for s in range(1, 21)]
  lines.append({"step": 20, "split": "eval", "loss": 1.2})
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_cli_on_a_tiny_checkpoint_writes_the_report_and_plots(model, tmp_path):
  from jaxencoder.probing import __main__ as probe
  cfg, params, _ = model
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  write_checkpoint(tmp_path / "run", cfg, params, vocab)
  data = tmp_path / "tags.txt"
  dataset = tagged_dataset([5 + i % 9 for i in range(60)])
  data.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                            for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n")
  out = tmp_path / "out"
  probe.main(["--checkpoint", str(tmp_path / "run"), "--data", str(data), "--out", str(out),
              "--max-epochs", "3", "--mlp"])
  report = json.loads((out / "report.json").read_text())
  assert len(report["probes"]["linear"]["layers"]) == cfg.num_layers + 1
  assert {"accuracy", "control_accuracy", "selectivity"} <= set(
      report["probes"]["mlp"]["layers"][0])
  assert np.array(report["attention"]["entropy"]).shape == (cfg.num_layers, cfg.num_heads)
  assert report["training_health"]["verdict"] == "healthy"
  assert len(report["representation"]) == cfg.num_layers + 1
  names = ("probe_linear", "probe_mlp", "attention_entropy", "cosine", "attention_maps",
           "attention_head")
  for name in names:
    png = out / f"{name}.png"
    assert png.read_bytes()[:4] == b"\x89PNG", name


def test_cli_reads_a_hugging_face_bert_directory(model, tmp_path):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  data = tmp_path / "s.csv"
  data.write_text("text,label\n" + "".join(
      f"{' '.join(WORDS[i % 7:i % 7 + 4])},{'yes' if i % 2 else 'no'}\n" for i in range(40)))
  out = tmp_path / "out"
  report = probe.main(["--pretrained", str(tmp_path / "hf"), "--data", str(data),
                       "--out", str(out), "--max-epochs", "2", "--pool", "mean"])
  assert report["data"]["level"] == "sentence" and report["data"]["pool"] == "mean"
  assert "control_accuracy" not in report["probes"]["linear"]["layers"][0]
  assert (out / "report.json").exists() and (out / "probe_linear.png").exists()


def test_cli_refuses_data_too_small_to_split(model, tmp_path, capsys):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  data = tmp_path / "s.csv"
  data.write_text("text,label\nthe cat,yes\na dog,no\n")
  with pytest.raises(SystemExit) as exit_info:
    probe.main(["--pretrained", str(tmp_path / "hf"), "--data", str(data), "--out",
                str(tmp_path / "out")])
  assert exit_info.value.code == 2
  assert "error: 2 sentences are too few to probe" in capsys.readouterr().err
  with pytest.raises(ValueError, match="too few to split"):
    from jaxencoder.probing import probes
    probes.split_items(np.arange(3))


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(model):
  cfg, params, tok = model
  small = cfg.replace(vocab_size=tok.vocab_size - 1)
  with pytest.raises(ValueError, match=rf"tokenizer has {tok.vocab_size} tokens but the "
                                       rf"model's embedding table has {tok.vocab_size - 1} rows"):
    features.extract(small, params, tok, tagged_dataset([3, 4]))


def test_read_dataset_takes_csv_columns_by_name_or_a_headerless_file(tmp_path):
  named = tmp_path / "named.csv"
  named.write_text("sentence,sentiment\nthe cat,pos\na dog,neg\n")
  with pytest.raises(ValueError, match=r"named.csv:1: header 'sentence,sentiment' has no column"):
    features.read_dataset(named)
  from jaxencoder.data import readers
  dataset = features.read_dataset(named, columns=readers.Columns(label="sentiment"))
  assert dataset.sentences == ["the cat", "a dog"] and dataset.labels == ["pos", "neg"]
  bare = tmp_path / "bare.csv"
  bare.write_text("the cat,pos\na dog,neg\n")
  dataset = features.read_dataset(bare, columns=readers.Columns(header=False))
  assert dataset.sentences == ["the cat", "a dog"] and dataset.labels == ["pos", "neg"]


@pytest.mark.slow
def test_cli_max_len_extends_a_pretrained_table_for_longer_sentences(model, tmp_path, caplog):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model  # a 64-row position table
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  data = tmp_path / "long.csv"
  data.write_text("text,label\n" + "".join(
      f"{' '.join(WORDS[i % 7:i % 7 + 4] * 25)},{'yes' if i % 2 else 'no'}\n" for i in range(20)))
  args = ["--pretrained", str(tmp_path / "hf"), "--data", str(data), "--max-epochs", "2"]
  short = probe.main(args + ["--out", str(tmp_path / "short")])
  assert short["data"]["buckets"][-1] == cfg.max_positions  # cut to the table
  longer = probe.main(args + ["--out", str(tmp_path / "long"), "--max-len", "128"])
  assert longer["data"]["buckets"][-1] == 128
  assert "position table resized by interpolation from 64 to 128 rows" in caplog.text


def test_extraction_reports_each_batch_with_the_layers_it_extracts(model, capsys, monkeypatch):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  cfg, params, tok = model
  features.extract(cfg, params, tok, tagged_dataset([3, 4, 5, 6, 7]), batch_size=2)
  lines = capsys.readouterr().err.splitlines()
  assert [line.split(",")[0] for line in lines] == [
      f"extracting layers 0-{cfg.num_layers}: {k}/3 batch" for k in (1, 2, 3)]


def test_probe_fitting_reports_each_layer(capsys, monkeypatch):
  from jaxencoder.probing import probes
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  rng = np.random.default_rng(0)
  layers = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(3)]
  probes.probe_all_layers(layers, np.arange(20) % 2, np.arange(20),
                          2, probes.ProbeConfig(max_epochs=1), types=[f"w{i}" for i in range(20)])
  lines = capsys.readouterr().err.splitlines()
  assert [line.split(",")[0] for line in lines] == [
      f"fitting linear probes (+ control): {k}/3 layer" for k in (1, 2, 3)]


def printed_table(stdout: str) -> list[dict[str, str]]:
  """The per-layer rows of the CLI's summary table, cells by their column name."""
  lines = stdout.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("layer "))
  header = lines[start].split()
  rows = []
  for line in lines[start + 1:]:
    if not line.split() or not line.split()[0].isdigit():
      break
    rows.append(dict(zip(header, line.split())))
  return rows


def test_a_sentence_probe_prints_no_selectivity_and_the_majority_baseline(model, tmp_path,
                                                                           capsys, monkeypatch):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  from jaxencoder.probing import probes
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  cfg, params, tok = model
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  labels = ["yes" if i % 3 else "no" for i in range(40)]
  data = tmp_path / "s.csv"
  data.write_text("text,label\n" + "".join(
      f"{' '.join(WORDS[i % 7:i % 7 + 4])},{label}\n" for i, label in enumerate(labels)))
  report = probe.main(["--pretrained", str(tmp_path / "hf"), "--data", str(data),
                       "--out", str(tmp_path / "out"), "--max-epochs", "1"])
  splits = probes.split_items(np.arange(len(labels)), seed=0)  # the CLI's default seed
  train = [labels[i] for i in splits["train"]]
  most_frequent = max(set(train), key=train.count)
  share = np.mean([labels[i] == most_frequent for i in splits["test"]])
  out = capsys.readouterr()
  rows = printed_table(out.out)
  assert len(rows) == cfg.num_layers + 1 and "nan" not in out.out
  assert all(row["linear_sel"] == "-" for row in rows)
  assert all(float(row["majority"]) == pytest.approx(share, abs=5e-4) for row in rows)
  assert report["majority_baseline"] == {"accuracy": pytest.approx(share),
                                         "label": most_frequent, "split": "test"}
  assert report["probes"]["linear"]["majority_baseline"] == pytest.approx(share)  # kept
  saved = json.loads((tmp_path / "out" / "report.json").read_text())
  assert saved["majority_baseline"]["label"] == most_frequent
  for phase in ("loading", f"representation health of {cfg.num_layers + 1} layers",
                "attention maps and plots"):
    assert any(line.startswith(phase) and line.endswith(" s") for line in out.err.splitlines())


def test_the_installed_command_exits_zero_after_a_study(monkeypatch):
  """`jaxencoder-probe` is a console script: it exits with what its function returns, so the
  function must return None (main returns the report for Python callers)."""
  from importlib import metadata

  from jaxencoder.probing import __main__ as probe
  from jaxencoder.probing import command as study_command
  command, = [e for e in metadata.entry_points(group="console_scripts")
              if e.name == "jaxencoder-probe"]
  monkeypatch.setattr(study_command, "probe", lambda args: {"report": "of the study"})
  monkeypatch.setattr("sys.argv", ["jaxencoder-probe", "--pretrained", "hf", "--data", "d.txt",
                                   "--out", "out"])
  assert probe.main() == {"report": "of the study"}
  assert command.load()() is None


def write_tagged(path, dataset) -> None:
  path.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                            for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n")


def test_read_dataset_reads_a_directory_of_tagged_files_in_name_order(tmp_path):
  first, second = tagged_dataset([4, 5], seed=1), tagged_dataset([6], seed=2)
  write_tagged(tmp_path / "b.txt", second)
  write_tagged(tmp_path / "a.txt", first)
  (tmp_path / "notes.md").write_text("not data\n")  # other kinds are left alone
  dataset = features.read_dataset(tmp_path)
  assert dataset.level == "word" and dataset.origin == str(tmp_path)
  assert dataset.sentences == first.sentences + second.sentences
  assert dataset.labels == first.labels + second.labels
  assert features.read_dataset(tmp_path, max_sentences=2).sentences == first.sentences


@pytest.mark.parametrize("files, message", [
    ((), "a directory needs word/TAG .txt, .conllu, or .csv/.tsv"),
    (("a.txt", "b.csv"), "mixes word tags (.txt/.conllu) and sentence labels (.csv/.tsv)")])
def test_a_data_directory_without_one_kind_of_files_is_refused_in_one_line(tmp_path, files,
                                                                           message):
  for name in files:
    (tmp_path / name).write_text("the/DET\n" if name.endswith(".txt") else "text,label\na,b\n")
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
    features.read_dataset(tmp_path)
  assert "\n" not in str(err.value)


def test_cli_reads_a_data_directory_streams_by_default_and_prints_the_health_verdict(
    model, tmp_path, capsys, monkeypatch):
  from jaxencoder.probing import __main__ as probe
  from jaxencoder.probing import probe_report
  cfg, params, _ = model
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  write_checkpoint(tmp_path / "run", cfg, params, vocab)
  (tmp_path / "data").mkdir()
  for part in range(2):
    write_tagged(tmp_path / "data" / f"part{part}.txt",
                 tagged_dataset([5 + i % 9 for i in range(30)], seed=part))
  figures, save = [], probe_report.save_figure
  monkeypatch.setattr(probe_report, "save_figure",
                      lambda fig, path: figures.append(fig) or save(fig, path))
  out = tmp_path / "out"
  report = probe.main(["--checkpoint", str(tmp_path / "run"), "--data", str(tmp_path / "data"),
                       "--out", str(out), "--max-epochs", "3"])
  assert report["data"]["sentences"] == 60 and report["data_source"] == str(tmp_path / "data")
  assert report["task"] == "word tags (3 labels)"
  assert report["layer_convention"]["layer"].startswith("0 = embeddings")
  assert not [p.name for p in out.iterdir() if p.is_dir()]  # streamed features are gone
  printed = capsys.readouterr().out
  assert f"training health: {report['training_health']['verdict']} (train loss" in printed
  context = probe_report.context(report)
  assert context.startswith("model: ") and str(tmp_path / "run")[-20:] in context
  assert "| data: " in context and context.endswith("data | task: word tags (3 labels)")
  for fig in figures:  # every plot names the model, the data and the task
    title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
    assert context in title, title
  assert len(figures) == len(report["plots"])


def test_keep_features_leaves_them_in_out_and_stream_is_a_noted_no_op(model, tmp_path,
                                                                      capsys):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok = model
  pretrained.save(tmp_path / "hf", cfg, params, tok)
  data = tmp_path / "tags.txt"
  write_tagged(data, tagged_dataset([5 + i % 9 for i in range(30)]))
  args = ["--pretrained", str(tmp_path / "hf"), "--data", str(data), "--max-epochs", "2",
          "--no-control"]
  probe.main(args + ["--out", str(tmp_path / "kept"), "--keep-features"])
  kept = features.load_features(tmp_path / "kept" / "features")
  assert len(kept.layers) == cfg.num_layers + 1 and len(kept.labels_M) == len(kept.layers[0])
  probe.main(args + ["--out", str(tmp_path / "streamed"), "--stream"])
  assert "--stream is the default now" in capsys.readouterr().err
  assert not [p for p in (tmp_path / "streamed").iterdir() if p.is_dir()]
