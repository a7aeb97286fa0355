"""Probing analyses on synthetic inputs: attention stats, representation health, probes, health."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxencoder.probing import attention_stats, health, probes, representation

NO_GROUPS = {k: jnp.zeros((1, 8), bool) for k in ("cls", "sep", "punct")}


def padded_mask(real: int, length: int = 8) -> jnp.ndarray:
  return (jnp.arange(length) < real)[None].astype(jnp.int32)  # [1, L]


# --- attention ---------------------------------------------------------------------------
def test_entropy_of_uniform_attention_over_n_real_tokens_is_log_n():
  n, length = 5, 8
  row_L = jnp.where(jnp.arange(length) < n, 1.0 / n, 0.0)
  probs_1x2xLxL = jnp.broadcast_to(row_L, (1, 2, length, length))
  entropy_1x2xL = attention_stats.entropy(probs_1x2xLxL, padded_mask(n))
  np.testing.assert_allclose(entropy_1x2xL[..., :n], math.log(n), rtol=1e-6)


def test_entropy_excludes_pad_keys_and_pad_queries():
  n, length = 5, 8
  real_L = jnp.arange(length) < n
  # Real queries: half the weight uniform on real keys, half on pad keys (renormalised away).
  row_L = jnp.where(real_L, 0.5 / n, 0.5 / (length - n))
  # Pad queries: one-hot (entropy 0); they must not count.
  rows_LxL = jnp.where(real_L[:, None], row_L[None], jnp.eye(length))
  probs_1x1xLxL = rows_LxL[None, None]
  sums = attention_stats.head_sums(probs_1x1xLxL, padded_mask(n), NO_GROUPS, threshold=0.1)
  means = attention_stats.head_means({k: np.asarray(v)[None] for k, v in sums.items()})
  np.testing.assert_allclose(means["entropy"], [[math.log(n)]], rtol=1e-6)
  assert float(sums["queries"]) == n


def test_entropy_of_one_hot_attention_is_zero():
  probs_1x1xLxL = jnp.eye(8)[None, None]
  np.testing.assert_allclose(attention_stats.entropy(probs_1x1xLxL, padded_mask(6))[..., :6],
                             0.0, atol=1e-7)


def test_attention_to_cls_gives_cls_share_one_and_distance_equal_to_position():
  length = 8
  probs_1x1xLxL = jnp.zeros((1, 1, length, length)).at[..., 0].set(1.0)
  groups = {**NO_GROUPS, "cls": (jnp.arange(length) == 0)[None]}
  sums = attention_stats.head_sums(probs_1x1xLxL, padded_mask(length), groups, threshold=0.5)
  means = attention_stats.head_means({k: np.asarray(v)[None] for k, v in sums.items()})
  assert means["cls"][0, 0] == pytest.approx(1.0)
  assert means["sep"][0, 0] == pytest.approx(0.0)
  assert means["sparsity"][0, 0] == pytest.approx(1.0)
  assert means["distance"][0, 0] == pytest.approx(np.mean(np.arange(length)))


def test_sparsity_of_uniform_attention_below_threshold_is_zero():
  probs_1x1xLxL = jnp.full((1, 1, 8, 8), 1 / 8)
  assert float(attention_stats.sparsity(probs_1x1xLxL, padded_mask(8), 0.2).max()) == 0.0


# --- representation health ---------------------------------------------------------------
def test_effective_rank_separates_isotropic_from_rank_one_features():
  rng = np.random.default_rng(0)
  isotropic_MxD = rng.normal(size=(500, 32))
  rank_one_MxD = rng.normal(size=(500, 1)) * rng.normal(size=(1, 32))
  assert representation.effective_rank(isotropic_MxD) > 0.8 * 32
  assert representation.effective_rank(rank_one_MxD) == pytest.approx(1.0, abs=1e-6)
  assert representation.effective_rank(rank_one_MxD, center=True) == pytest.approx(1.0, abs=1e-6)


def test_collapse_flag_fires_on_identical_embeddings_not_on_random_ones():
  rng = np.random.default_rng(0)
  identical_MxD = np.tile(rng.normal(size=(1, 32)), (300, 1))
  collapsed = representation.layer_health(identical_MxD)
  healthy = representation.layer_health(rng.normal(size=(300, 32)))
  assert collapsed["collapsed"] and len(collapsed["collapse_reasons"]) == 3
  assert collapsed["anisotropy"] == pytest.approx(1.0)
  assert not healthy["collapsed"], healthy["collapse_reasons"]
  assert abs(healthy["anisotropy"]) < 0.05


def test_collapse_thresholds_come_from_a_dict_and_reject_unknown_keys():
  strict = representation.CollapseThresholds.from_dict({"max_mean_cosine": -1.0})
  random_MxD = np.random.default_rng(0).normal(size=(100, 16))
  assert representation.layer_health(random_MxD, strict)["collapsed"]
  with pytest.raises(ValueError, match="max_cos"):
    representation.CollapseThresholds.from_dict({"max_cos": 0.5})


# --- probes --------------------------------------------------------------------------------
def planted_task(items: int = 3000, dim: int = 16, classes: int = 3, seed: int = 0):
  """Features with a linear label signal; word types unrelated to the features."""
  rng = np.random.default_rng(seed)
  x_MxD = rng.normal(size=(items, dim)).astype(np.float32)
  y_M = np.argmax(x_MxD @ rng.normal(size=(dim, classes)), -1).astype(np.int32)
  types = [f"w{i}" for i in rng.integers(0, 400, items)]
  sentence_ids_M = np.arange(items) // 6
  return x_MxD, y_M, types, sentence_ids_M


def test_linear_probe_recovers_planted_signal_while_control_stays_near_chance():
  x_MxD, y_M, types, sentence_ids_M = planted_task()
  cfg = probes.ProbeConfig(max_epochs=30, patience=3)
  result = probes.probe_all_layers([x_MxD], y_M, sentence_ids_M, 3, cfg, types=types)
  layer = result["layers"][0]
  assert layer["accuracy"] > 0.9
  assert layer["control_accuracy"] < result["control_majority_baseline"] + 0.08
  assert layer["selectivity"] > 0.45
  assert result["majority_baseline"] < 0.6


def test_probe_on_noise_features_does_not_beat_majority_by_much():
  x_MxD, y_M, types, sentence_ids_M = planted_task()
  noise_MxD = np.random.default_rng(9).normal(size=x_MxD.shape).astype(np.float32)
  result = probes.probe_all_layers([noise_MxD], y_M, sentence_ids_M, 3,
                                   probes.ProbeConfig(max_epochs=10, patience=2))
  assert result["layers"][0]["accuracy"] < result["majority_baseline"] + 0.08


def test_probes_are_deterministic_for_a_seed():
  x_MxD, y_M, types, sentence_ids_M = planted_task(items=600)
  cfg = probes.ProbeConfig(kind="mlp", hidden=16, max_epochs=3)
  runs = [probes.probe_all_layers([x_MxD], y_M, sentence_ids_M, 3, cfg, types=types)
          for _ in range(2)]
  assert runs[0] == runs[1]


def test_splits_are_by_sentence_and_cover_every_item_once():
  sentence_ids_M = np.repeat(np.arange(50), np.arange(50) % 7 + 1)
  splits = probes.split_items(sentence_ids_M, seed=3)
  everything = np.concatenate(list(splits.values()))
  assert sorted(everything) == list(range(len(sentence_ids_M)))
  owners = [set(sentence_ids_M[idx]) for idx in splits.values()]
  assert not (owners[0] & owners[1] or owners[0] & owners[2] or owners[1] & owners[2])
  again = probes.split_items(sentence_ids_M, seed=3)
  assert all(np.array_equal(splits[k], again[k]) for k in splits)


def test_control_task_gives_each_word_type_one_label_with_the_task_distribution():
  rng = np.random.default_rng(0)
  types = [f"w{i}" for i in rng.integers(0, 2000, 20000)]
  labels_M = rng.choice(3, size=20000, p=[0.6, 0.3, 0.1]).astype(np.int32)
  control_M = probes.control_labels(types, labels_M, 3, seed=1)
  by_type = {}
  for t, c in zip(types, control_M):
    assert by_type.setdefault(t, c) == c
  share = np.bincount(list(by_type.values()), minlength=3) / len(by_type)
  np.testing.assert_allclose(share, [0.6, 0.3, 0.1], atol=0.04)


# --- training health ---------------------------------------------------------------------
def records(train_losses, eval_losses=(), eval_every: int = 10):
  out = [{"step": i + 1, "split": "train", "loss": v} for i, v in enumerate(train_losses)]
  out += [{"step": (i + 1) * eval_every, "split": "eval", "loss": v}
          for i, v in enumerate(eval_losses)]
  return out


def test_health_flags_overfitting_when_eval_loss_rises_above_falling_train_loss():
  train = np.linspace(3.0, 0.2, 100)
  report = health.training_health(records(train, [2.5, 1.5, 1.2, 1.3, 1.6, 2.0]))
  assert report["overfitting"] and report["verdict"] == "overfitting"
  assert report["gap"] > 1.0


def test_health_flags_no_learning_on_a_flat_noisy_loss():
  train = 3.0 + 0.01 * np.random.default_rng(0).normal(size=100)
  report = health.training_health(records(train, [3.0, 3.0]))
  assert report["no_learning"] and report["verdict"].startswith("underfitting")


def test_health_calls_a_steadily_falling_run_healthy():
  train = 3.0 * np.exp(-np.linspace(0, 2, 100))
  report = health.training_health(records(train, 1.05 * train[9::10]))
  assert report["flags"] == [] and report["verdict"] == "healthy"


def test_punctuation_share_is_the_attention_mass_on_punctuation_tokens():
  """[CLS] the cat , sat . [SEP]: heads putting all, half or none of each query's weight
  on the ',' and '.' tokens; '##s' and the specials are not punctuation."""
  from data_helpers import VOCAB, tiny_tokenizer
  tokenizer = tiny_tokenizer()
  punct_V = attention_stats.punctuation_table(tokenizer)
  assert sorted(VOCAB[i] for i in np.flatnonzero(punct_V)) == [",", "."]
  ids = np.array([[VOCAB.index(t) for t in "[CLS] the cat , sat . [SEP]".split()]])
  groups = attention_stats.token_groups(ids, tokenizer, punct_V)
  np.testing.assert_array_equal(groups["punct"], [[0, 0, 0, 1, 0, 1, 0]])
  length = ids.shape[1]
  rows = {"all": np.array([0, 0, 0, 0.5, 0, 0.5, 0]),
          "half": np.array([0.25, 0, 0, 0.25, 0.25, 0.25, 0]),
          "none": np.full(length, 1 / 5) * (groups["punct"][0] == 0)}
  probs_1xHxLxL = jnp.asarray(np.stack([np.tile(r, (length, 1)) for r in rows.values()])[None])
  sums = attention_stats.head_sums(probs_1xHxLxL, jnp.ones((1, length)), groups, threshold=0.1)
  means = attention_stats.head_means({k: np.asarray(v)[None] for k, v in sums.items()})
  np.testing.assert_allclose(means["punct"][0], [1.0, 0.5, 0.0], atol=1e-6)
  np.testing.assert_allclose(means["cls"][0], [0.0, 0.25, 0.2], atol=1e-6)


def test_health_flags_a_plateau_when_the_loss_stops_falling():
  falling_then_flat = np.concatenate([np.linspace(4.0, 1.0, 60), np.full(40, 1.0)])
  report = health.training_health(records(falling_then_flat))
  assert report["plateau"] and report["flags"] == ["plateau"]
  assert report["verdict"] == "plateau" and report["end_change"] < 0.01
  still_falling = np.linspace(4.0, 1.0, 100)  # the last two windows differ by ~9%
  assert not health.training_health(records(still_falling))["plateau"]
  assert not health.training_health(records([3.0, 3.0, 3.0]))["plateau"]  # too short to say


@pytest.mark.parametrize("plot", ["probe", "cosine"])
def test_plot_legends_sit_right_of_the_axes_covering_no_data(plot, tmp_path, monkeypatch):
  from jaxencoder.probing import probe_report
  figures = []
  monkeypatch.setattr(probe_report, "save_figure",
                      lambda fig, path: figures.append(fig) or path)
  if plot == "probe":
    rows = [{"layer": n, "accuracy": 0.9, "control_accuracy": 0.6, "selectivity": 0.3}
            for n in range(3)]
    probe_report.plot_probe_accuracy({"majority_baseline": 0.5, "layers": rows},
                                     tmp_path / "p.png")
  else:
    rng = np.random.default_rng(0)
    probe_report.plot_cosine_by_layer(representation.all_layers(
        [rng.normal(size=(8, 4)) for _ in range(3)]), tmp_path / "c.png")
  fig = figures[0]
  renderer = fig.canvas.get_renderer()
  ax = fig.axes[0]
  assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def captured_figures(monkeypatch):
  """Figures the report's plot functions make, kept instead of written."""
  from jaxencoder.probing import probe_report
  figures = []
  monkeypatch.setattr(probe_report, "save_figure", lambda fig, path: figures.append(fig) or path)
  return figures


def test_selectivity_has_an_axis_of_its_own_below_the_accuracy_one(tmp_path, monkeypatch):
  from jaxencoder.probing import probe_report
  figures = captured_figures(monkeypatch)
  rows = [{"layer": n, "accuracy": 0.9, "control_accuracy": 0.6 + 0.1 * n,
           "selectivity": 0.3 - 0.1 * n} for n in range(3)]
  probe_report.plot_probe_accuracy({"majority_baseline": 0.5, "layers": rows},
                                   tmp_path / "p.png", context="model: m | data: d | task: t")
  accuracy_ax, selectivity_ax = figures[0].axes
  assert [b.get_height() for b in selectivity_ax.patches] == pytest.approx([0.3, 0.2, 0.1])
  assert not accuracy_ax.patches  # no bar crosses the majority line
  majority = [line for line in accuracy_ax.lines if line.get_label() == "majority"]
  assert majority and majority[0].get_ydata()[0] == 0.5
  assert "majority" not in [line.get_label() for line in selectivity_ax.lines]
  assert accuracy_ax.get_ylim()[0] == 0 and "selectivity" in selectivity_ax.get_ylabel()
  assert selectivity_ax.get_xlabel().startswith("layer (0 = embeddings")


def test_a_control_line_equal_to_the_task_line_stays_visible(tmp_path, monkeypatch):
  from jaxencoder.probing import probe_report
  figures = captured_figures(monkeypatch)
  rows = [{"layer": n, "accuracy": 0.8, "control_accuracy": 0.8, "selectivity": 0.0}
          for n in range(3)]
  probe_report.plot_probe_accuracy({"majority_baseline": 0.5, "layers": rows}, tmp_path / "p.png")
  lines = {line.get_label(): line for line in figures[0].axes[0].lines}
  task, control = lines["task"], lines["control"]
  np.testing.assert_array_equal(task.get_ydata(), control.get_ydata())
  assert task.get_marker() != control.get_marker()
  assert task.get_linestyle() != control.get_linestyle()
  assert control.get_markersize() > task.get_markersize()  # its open marker rings the task's
  assert control.get_markerfacecolor() == "none" and task.get_zorder() > control.get_zorder()
  legend = [t.get_text() for t in figures[0].axes[0].get_legend().get_texts()]
  assert legend == ["task", "control", "majority"]


def test_head_heat_maps_number_layers_from_one_and_heads_from_zero(tmp_path, monkeypatch):
  from jaxencoder.probing import probe_report
  figures = captured_figures(monkeypatch)
  probe_report.plot_head_heatmap(np.zeros((2, 3)), tmp_path / "h.png", context="ctx")
  ax = figures[0].axes[0]
  assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
  assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
  assert "0 = embeddings" in ax.get_ylabel() and "from 0" in ax.get_xlabel()
  assert ax.get_title().endswith("\nctx")


def test_the_health_verdict_line_names_the_verdict_and_the_losses():
  train = np.linspace(3.0, 1.0, 50)
  line = health.verdict_line(health.training_health(records(train, [2.5, 1.5, 1.2, 1.3, 1.6, 2.0])))
  assert line.startswith("training health: overfitting (train loss ")
  assert "eval loss 2.000" in line
  assert health.verdict_line({"error": "no train loss records", "flags": []}) == (
      "training health: unknown (no train loss records)")
