"""Training schedules: the LR's warmup-stable-decay (optim.schedule="wsd") and the MLM
mask-rate schedule (data.mask_rate_schedule), exact on resume."""

import math

import ml_collections
import numpy as np
import pytest

import train_helpers as th
from data_helpers import VOCAB, assert_batches_equal, sentences, tiny_tokenizer
from jaxencoder.data import mlm, packing, pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.tasks import masked_lm
from jaxencoder.train.config import apply_overrides, base_config, finalize
from jaxencoder.train.optim import (default_optim_config, learning_rate_schedule,
                                    make_optimizer, wsd_decay_steps)
from jaxencoder.train.resume import config_changes

SPECIALS = (0, 1, 2, 3, 4)  # data_helpers.VOCAB's [PAD] [UNK] [CLS] [SEP] [MASK]


def wsd(**overrides):
  cfg = default_optim_config()
  cfg.update({"schedule": "wsd", "learning_rate": 2.0, "warmup_steps": 10, "total_steps": 110,
              "decay_fraction": 0.2, "end_lr_factor": 0.1, **overrides})
  return cfg


# ------------------------------------------------------------------ wsd
@pytest.mark.parametrize("shape, decay", [
    ("linear", lambda x: 1.0 - x),
    ("1-sqrt", lambda x: 1.0 - math.sqrt(x)),
])
def test_wsd_is_warmup_then_peak_then_the_shaped_decay_to_the_end_factor(shape, decay):
  """total 110, decay_fraction 0.2: 22 decay steps from step 88; end = 0.1 x peak."""
  lr_fn = learning_rate_schedule(wsd(decay_shape=shape))
  peak, end = 2.0, 0.1
  at_decay = lambda x: peak * (end + (1.0 - end) * decay(x))
  expected = {0: 0.0, 5: 1.0, 10: peak, 49: peak, 88: peak,  # warmup, stable, decay start
              89: at_decay(1 / 22), 99: at_decay(0.5), 109: at_decay(21 / 22),
              110: peak * end, 1000: peak * end}
  got = {step: float(lr_fn(step)) for step in expected}
  np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-6, atol=1e-7)


def test_wsd_decay_steps_round_the_fraction_and_keep_at_least_one():
  assert wsd_decay_steps(wsd(total_steps=1000, decay_fraction=0.1)) == 100
  assert wsd_decay_steps(wsd(total_steps=3, decay_fraction=0.1)) == 1
  assert wsd_decay_steps(wsd(total_steps=50, decay_fraction=1.0)) == 50


def test_wsd_without_room_for_a_stable_phase_decays_right_after_warmup():
  lr_fn = learning_rate_schedule(wsd(warmup_steps=10, total_steps=20, decay_fraction=0.5,
                                     decay_shape="linear", end_lr_factor=0.0))
  np.testing.assert_allclose([float(lr_fn(s)) for s in (10, 15, 20)], [2.0, 1.0, 0.0],
                             atol=1e-7)


def test_the_optimizers_update_t_applies_the_wsd_lr_of_step_t():
  """Lion's update is lr x sign(...): its size reads the LR each update used, counted
  from 0 (train_step makes one update per step, whatever optim.grad_accum_steps)."""
  cfg = wsd(name="lion", weight_decay=0.0, grad_clip_norm=0.0, warmup_steps=2, total_steps=10,
            decay_fraction=0.3)
  params = {"w": np.ones((3,), np.float32)}
  tx, lr_fn = make_optimizer(cfg, params, num_layers=0)
  state, sizes = tx.init(params), []
  for _ in range(11):
    updates, state = tx.update({"w": np.ones((3,), np.float32)}, state, params)
    sizes.append(float(np.abs(updates["w"][0])))
  np.testing.assert_allclose(sizes, [float(lr_fn(t)) for t in range(11)], rtol=1e-6)
  assert sizes[1] == pytest.approx(1.0) and sizes[6] == pytest.approx(2.0)  # warmup, stable


@pytest.mark.parametrize("overrides, message", [
    ({"decay_fraction": 0.0}, r"decay_fraction=0.0 must lie in \(0, 1\]"),
    ({"decay_fraction": 1.5}, r"decay_fraction=1.5 must lie in \(0, 1\]"),
    ({"decay_shape": "cosine"}, r"decay_shape='cosine'; allowed values: \('1-sqrt', 'linear'\)"),
    ({"warmup_steps": 90}, r"warmup_steps \(90\) \+ the decay's 22 steps .* exceed "
                           r"total_steps \(110\)"),
])
def test_bad_wsd_settings_raise_naming_the_key(overrides, message):
  with pytest.raises(ValueError, match=message):
    learning_rate_schedule(wsd(**overrides))


def test_wsd_keys_come_from_the_command_line_and_clip_a_short_runs_warmup():
  config = base_config()
  apply_overrides(config, ["optim.schedule=wsd", "optim.decay_shape=linear",
                           "optim.decay_fraction=0.5", "optim.warmup_steps=100",
                           "num_train_steps=30"])
  config = finalize(config)
  # 100 warmup steps in a 30-step run: its first tenth (3), leaving the 15 decay steps.
  assert (config.optim.decay_shape, config.optim.decay_fraction) == ("linear", 0.5)
  assert config.optim.warmup_steps == 3
  learning_rate_schedule(config.optim)  # fits


def test_a_run_stored_before_the_new_keys_resumes_and_changing_the_decay_is_allowed():
  current = finalize(base_config())
  saved = current.to_dict()
  del saved["optim"]["decay_fraction"], saved["optim"]["decay_shape"]
  del saved["data"]["mask_rate_schedule"]
  assert config_changes(saved, current) == ([], [])
  assert masked_lm.auto_max_predictions(saved["data"]) == masked_lm.auto_max_predictions(
      current.data)
  learning_rate_schedule(finalize(ml_collections.ConfigDict(saved)).optim)  # evaluate_run's
  current.unlock()
  current.optim.decay_fraction = 0.2
  allowed, structural = config_changes(saved, current)
  assert allowed == ["optim.decay_fraction: 0.1 -> 0.2"] and structural == []


# ------------------------------------------------------------------ mask-rate schedule
MMBERT = ((0, 0.3), (80000, 0.15), (95000, 0.05))


@pytest.mark.parametrize("schedule, rate, expected", [
    (MMBERT, 0.15, {0: 0.3, 79999: 0.3, 80000: 0.15, 94999: 0.15, 95000: 0.05, 10**6: 0.05}),
    (((10, 0.3), (20, 0.1)), 0.15, {0: 0.15, 9: 0.15, 10: 0.3, 19: 0.3, 20: 0.1}),
    ((), 0.15, {0: 0.15, 10**6: 0.15}),
])
def test_the_scheduled_rate_is_the_last_point_started_else_mask_rate(schedule, rate, expected):
  got = {step: mlm.scheduled_rate(schedule, step, rate) for step in expected}
  assert got == expected


def _rows(n_rows=64, length=24, seed=0):
  rng = np.random.default_rng(seed)
  ids, words = np.zeros((n_rows, length), np.int32), np.full((n_rows, length), -1)
  for i, n in enumerate(rng.integers(2, length + 1, n_rows)):
    ids[i, :n] = np.concatenate([[2], rng.integers(5, len(VOCAB), n - 2), [3]])
    words[i, 1:n - 1] = np.sort(rng.integers(0, max(1, n // 2), n - 2))
  return ids, words


@pytest.mark.parametrize("whole_word", [False, True])
def test_a_plan_masked_at_a_rate_is_the_batch_masked_at_that_rate(whole_word):
  ids, words = _rows()
  draws = mlm.counter_uniforms(5, np.arange(len(ids)), ids.shape[1])
  spec = mlm.MaskSpec(len(VOCAB), 4, SPECIALS, whole_word=whole_word)
  plan = mlm.mask_plan(ids, spec, draws, words)
  chosen = []
  for rate in (0.05, 0.15, 0.3, 0.6):
    direct = mlm.mask_batch(ids, mlm.MaskSpec(len(VOCAB), 4, SPECIALS, rate=rate,
                                              whole_word=whole_word), draws, words)
    late = mlm.apply_rate(plan, rate)
    assert late.keys() == direct.keys()
    for k in direct:
      np.testing.assert_array_equal(late[k], direct[k])
    chosen.append(late["mlm_weights"] > 0)
  for lower, higher in zip(chosen, chosen[1:]):  # a higher rate adds to a lower one's picks
    assert not (lower & ~higher).any() and (higher & ~lower).any()


def _candidates(batch):
  """Per row: its non-special tokens (pad mode: one sequence per row)."""
  return (~np.isin(batch["mlm_labels"], SPECIALS) & (batch["attention_mask"] > 0)).sum(1)


def _mlm(schedule=(), rate=0.15, mode="pad", **read):
  return pipeline.mlm_pipeline(
      sentences(200, seed=3), tiny_tokenizer(), seq_len=16, batch_size=4, mode=mode,
      mask=pipeline.default_mask(tiny_tokenizer(), rate=rate), rate_schedule=schedule,
      read=Reading(seed=1, num_epochs=None, shard_index=0, shard_count=1, **read))


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


SCHEDULE = ((2, 0.5), (5, 0.1))  # batches 0-1: mask_rate 0.15; 2-4: 0.5; 5 on: 0.1


@pytest.mark.parametrize("mode", packing.MODES)
def test_batch_k_is_the_constant_rate_pipelines_batch_k_at_the_rate_of_k(mode):
  scheduled = _take(iter(_mlm(SCHEDULE, mode=mode)), 7)
  for k, batch in enumerate(scheduled):
    rate = mlm.scheduled_rate(SCHEDULE, k, 0.15)
    assert_batches_equal([batch], [_take(iter(_mlm(rate=rate, mode=mode)), k + 1)[k]])
    if mode == "pad":
      n = _candidates(batch)
      np.testing.assert_array_equal(batch["mlm_weights"].sum(1),
                                    np.where(n > 0, np.maximum(np.round(rate * n), 1), 0))


@pytest.mark.parametrize("mode", packing.MODES)
def test_masks_of_batch_k_are_the_same_after_a_restore(mode):
  """Restored from the saved state (the checkpoint's path) or by skipping the consumed
  batches (a checkpoint from another worker count): the batches of an uninterrupted
  iterator, each at its own step's rate."""
  from jaxencoder.train.loop import peek, restore_data_position
  straight = _take(iter(_mlm(SCHEDULE, mode=mode)), 8)
  first = iter(_mlm(SCHEDULE, mode=mode))
  _take(first, 3)
  peek(first)
  saved = {"process_count": 1, "layout": 2, "workers": 0, "states": [first.get_state()]}
  resumed = iter(_mlm(SCHEDULE, mode=mode))
  restore_data_position(resumed, saved, step=3)
  assert_batches_equal(_take(resumed, 5), straight[3:])
  skipped = iter(_mlm(SCHEDULE, mode=mode))
  restore_data_position(skipped, {}, step=3)  # no usable state: skips 3 batches
  assert_batches_equal(_take(skipped, 5), straight[3:])


@pytest.mark.slow
def test_worker_processes_make_the_scheduled_batches_of_the_caller():
  assert_batches_equal(_take(iter(_mlm(SCHEDULE, mode="pack", workers=2)), 7),
               _take(iter(_mlm(SCHEDULE, mode="pack")), 7))


def _config(tmp_path, task="mlm", schedule=((0, 0.5), (3, 0.1))):
  root = tmp_path
  config = th.tiny_config(root, th.text_corpus(root), th.write_vocab(root))
  config.task, config.data.mask_rate_schedule = task, schedule
  return config


@pytest.mark.parametrize("task", ["mlm", "electra"])
def test_train_batches_follow_the_schedule_and_eval_keeps_mask_rate(tmp_path, task):
  from jaxencoder.train.datasets import make_pipelines
  config = finalize(_config(tmp_path, task))
  pipes = make_pipelines(config)
  train = iter(pipes.train)
  for step in range(5):
    batch, rate = next(train), (0.5 if step < 3 else 0.1)
    n = _candidates(batch)
    np.testing.assert_array_equal(batch["mlm_weights"].sum(1), np.maximum(np.round(rate * n), 1))
    assert not set(mlm.PLAN_KEYS) & set(batch)
  batch = next(iter(pipes.make_eval()))
  n = _candidates(batch)
  real = batch["attention_mask"].sum(1) > 0
  np.testing.assert_array_equal(batch["mlm_weights"].sum(1)[real],
                                np.maximum(np.round(0.15 * n), 1)[real])


def test_auto_max_predictions_sizes_for_the_highest_rate():
  data = {"mask_rate": 0.15, "seq_len": 100, "mask_rate_schedule": MMBERT}
  assert masked_lm.auto_max_predictions(data) == math.ceil(1.25 * 0.3 * 100) + 1
  data["mask_rate"] = 0.4  # eval's rate is the highest
  assert masked_lm.auto_max_predictions(data) == math.ceil(1.25 * 0.4 * 100) + 1


@pytest.mark.parametrize("schedule, message", [
    (((0, 0.3), (10, 0.0)), r"rate 0.0 must lie in \(0, 1\)"),
    (((0, 1.0),), r"rate 1.0 must lie in \(0, 1\)"),
    (((-1, 0.3),), r"steps must be integers >= 0, strictly increasing"),
    (((10, 0.3), (10, 0.2)), r"steps must be integers >= 0, strictly increasing"),
    (((10, 0.3), (5, 0.2)), r"steps must be integers >= 0, strictly increasing"),
    (((0.5, 0.3),), r"steps must be integers"),
    ((0.3,), r"must be a list of \(step, rate\) pairs"),
])
def test_bad_mask_rate_schedules_raise_naming_the_key(schedule, message):
  config = base_config()
  config.data.mask_rate_schedule = schedule
  with pytest.raises(ValueError, match=r"data.mask_rate_schedule=.*" + message):
    finalize(config)


def test_sentence_pair_tasks_refuse_a_mask_rate_schedule():
  config = base_config()
  config.sentence_pair, config.data.mask_rate_schedule = "sop", ((0, 0.3),)
  with pytest.raises(ValueError, match=r"task 'mlm_sop' masks its sentence pairs at "
                     r"data.mask_rate only; set data.mask_rate_schedule=\(\)"):
    finalize(config)


def test_the_schedule_comes_from_the_command_line():
  config = base_config()
  apply_overrides(config, ["data.mask_rate_schedule=((0, 0.3), (80000, 0.15), (95000, 0.05))"])
  assert masked_lm.mask_rate_schedule(finalize(config).data) == MMBERT


@pytest.mark.slow
def test_a_resumed_run_masks_each_step_at_its_rate_and_matches_an_uninterrupted_one(
    tmp_path, monkeypatch):
  """Packed rows, the rate changing at steps 2 and 5, stopped at step 3 and resumed: the
  batch each step consumes is the constant-rate pipeline's batch of that step at the
  step's rate, in both runs; the losses and params are those of 8 straight steps."""
  import jax
  from jaxencoder.train import loop
  from jaxencoder.train.datasets import make_pipelines
  schedule = ((2, 0.45), (5, 0.1))
  config = _config(tmp_path, schedule=schedule)
  config.num_train_steps, config.optim.total_steps, config.data.packing = 8, 8, "pack"
  config.optim.schedule, config.optim.decay_fraction = "wsd", 0.25
  expected = {}
  for rate in (0.15, 0.45, 0.1):
    constant = ml_collections.ConfigDict(config.to_dict())
    constant.data.mask_rate, constant.data.mask_rate_schedule = rate, ()
    expected[rate] = _take(iter(make_pipelines(finalize(constant)).train), 8)
  consumed = []  # (run, host batch) of every step, in order

  class Recording(loop.DevicePrefetch):
    def __next__(self):
      host, device = super().__next__()
      consumed.append((run_name, host))
      return host, device
  monkeypatch.setattr(loop, "DevicePrefetch", Recording)
  run_name = "straight"
  loop.train_and_evaluate(config, tmp_path / "straight")
  run_name = "resumed"
  config.num_train_steps = 3
  loop.train_and_evaluate(config, tmp_path / "resumed")
  config.num_train_steps = 8
  loop.train_and_evaluate(config, tmp_path / "resumed")
  for run in ("straight", "resumed"):
    batches = [batch for name, batch in consumed if name == run]
    want = [expected[mlm.scheduled_rate(schedule, t, 0.15)][t] for t in range(8)]
    assert_batches_equal([{k: b[k] for k in ("input_ids", "mlm_weights")} for b in batches],
                 [{k: b[k] for k in ("input_ids", "mlm_weights")} for b in want])
  np.testing.assert_array_equal(th.train_losses(tmp_path / "resumed"),
                                th.train_losses(tmp_path / "straight"))
  a, b = (th.final_params(config, tmp_path / d) for d in ("straight", "resumed"))
  jax.tree.map(np.testing.assert_array_equal, a, b)
