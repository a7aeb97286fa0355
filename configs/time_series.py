"""Time-series classification on a UCR/UEA set (default: GunPoint, 150 steps, 1 channel).

  python train.py --config configs/time_series.py --workdir runs/gunpoint

The set is fetched (pip download aeon==1.6.0, its .ts files read directly) and prepared
on first use (or ahead: python -m jaxencoder.data fetch ucr/GunPoint --data-dir data); pick another with --config.data.source=ucr/<NAME> (a wrong name lists the
ones there). A multichannel set needs its channel count, e.g. (6 channels, 100 steps):
--config.data.source=ucr/BasicMotions --config.model.input_features=6
(a mismatch fails before training with "ucr/BasicMotions: its series have 6 channels per
step but model.input_features=1: add --config.model.input_features=6"); measured with
--config.num_train_steps=500 (32 train + 8 validation / 40 test), 2026-12-01: test accuracy 1.000
(40/40), 1 min 19 s wall, shared (baseline, all 40 train: 1-NN DTW 0.975, 1-NN
Euclidean 0.600).

1 in 5 train series (10 of GunPoint's 50) is held out as validation (eval metrics, to
read); the final state, the one checkpoint, is scored once on the test split
(`data.test_split`: test_* metrics in the log and metrics.jsonl). Train series are
augmented: moved by up to 10 steps (`data.random_shift`) and scaled by 0.8-1.2
(`data.random_scale`).
Measured 2026-12-05 on the 2-core CPU machine shared with other jobs, GunPoint standard
split (40 train + 10 validation / 150 test), `python bench/results.py time_series` (seeds
0, 1, 2): test accuracy 0.9867 / 0.9533 / 0.9667, mean 0.9689 (range 0.9533-0.9867);
RESULT below declares them. Wall 4.9 / 8.4 / 6.7 min at load 4.8-8.0 (3 min 27 s for
seed 0 at load 0.2-4, the first fetch included).
Choosing the checkpoint on 10 validation series instead (2026-12-01's recipe, every 250
steps, best validation accuracy) scored 0.9867 / 0.9133 / 0.9667 at head (mean 0.9556):
seed 1's validation accuracy tied at 1.0 first at step 1000 (test 0.9133; its final state
0.9533), 10 series choose too coarsely. Same split, 2026-12-01: no augmentation 0.893
(validation 0.9); shift only 0.960.
Baselines (bench/baselines_vision_series.py, on all 50 train series): 1-NN DTW, full
window, 0.907 (136/150); 1-NN Euclidean 0.913.
"""

from jaxencoder.model.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config


# What bench/results.py checks: test accuracy of seeds 0, 1, 2 (above); a mean further than
# `spread` from theirs is flagged (within it, the mean stays above the 0.93 goal).
RESULT = dict(metric="test_accuracy", values=(0.9867, 0.9533, 0.9667), spread=0.03)


def get_config():
  config = base_config()
  config.task = "classify"
  config.model = model_config(EncoderConfig.preset(
      "tiny", input_kind="series", input_features=1, type_vocab_size=0, max_len=512,
      emb_dim=64, num_heads=4, mlp_dim=128, norm_position="pre", pooling="mean"))
  config.data.kind = "time_series"
  config.data.source = "ucr/GunPoint"  # any ucr/<NAME> in the aeon wheel; fetched on first use
  # 1 in 5 train series (10 of GunPoint's 50) held out for validation; the final state is
  # scored once on the test split (test_* metrics): test never picks the checkpoint.
  config.data.eval_split = ""
  config.data.holdout_every = 5
  config.data.test_split = "test"
  config.data.seq_len = 150  # the longest series; longer ones are an error
  config.data.random_shift = 10  # train: each series moved by up to 10 steps either way,
  config.data.random_scale = 0.2  # and scaled by 0.8-1.2
  config.batch_size = 16
  config.eval_batch_size = 50
  config.num_train_steps = 2000
  config.eval_every = 250  # validation accuracy along the way, to read, not to choose:
  config.checkpoint_every = 2000  # the final state is the one checkpoint, so the one scored
  config.optim.learning_rate = 3e-3
  config.optim.schedule = "cosine"
  config.optim.warmup_steps = 100
  return config
