"""A small ViT on Fashion-MNIST (28x28x1) with a convolutional stem, fetched via apt.

  python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit

Fetched (apt-get download dataset-fashion-mnist) and prepared on first use. Two 3x3
convolutions of stride 2 (32 and 64 channels, GELU) turn the image into a 7x7 grid of
64-channel tokens (1x1 patches), + [CLS]; then 2 pre-norm blocks of width 64, mean-pooled.
The host CPU is split into 2 JAX devices (cpu_devices=2, data parallel): 0.035 s a step
against 0.054 s as one device, measured together by bench/cpu_devices.py (1.57x).
Measured 2026-12-01 on the 2-core CPU machine, idle, standard split (60k train / 10k test):
test accuracy 0.9023 at step 10000 (0.887 at 5000), 6 min 27 s wall including setup
(data prepared) and both evals. Re-measured 2026-12-05 at the project's head (fresh data
directory, the machine shared: load 4.3-5.7): 0.9023 again (seed 0), 8 min 34 s wall.
Three seeds (2026-12-05, `python bench/results.py vit_fashion_mnist --seeds 3`, shared
cores; seed 2 alone, idle: 7.4 min): 0.9023 / 0.8982 / 0.9006, mean 0.9004. The mean meets
the 0.90 goal by 0.0004 only: one seed in three lands below it.
Same recipe on one CPU device (before cpu_devices), same day:
  10000 steps   0.9029   9 min 58 s (a fast spell of this machine)
   9000 steps   0.9003  11 min 34 s (a slow spell: its speed drifts by ~35%)
   7000 steps   0.891    8 min 59 s (load 2.5-3)
  plain ViT, 4x4 patches, 6000 steps          0.870   7 min 51 s
  one stride-1 stem conv (32), 4x4 patches    0.879   8 min 43 s
  7000 steps + --config.data.random_flip=True 0.891   8 min 37 s
Baseline (bench/baselines_vision_series.py): logistic regression on raw pixels 0.842.
"""

from jaxencoder.model.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config


# What bench/results.py checks: eval accuracy at the last step (eval_split is the test split)
# of seeds 0, 1, 2 (above); a mean further than `spread` from theirs is flagged.
RESULT = dict(metric="accuracy", values=(0.9023, 0.8982, 0.9006), spread=0.01)


def get_config():
  config = base_config()
  config.task = "classify"
  config.model = model_config(EncoderConfig.preset(
      "tiny", input_kind="image", image_size=(28, 28), patch_size=1, num_channels=1,
      stem_channels=(32, 64), stem_stride=2, num_layers=2, emb_dim=64, num_heads=4, mlp_dim=128, norm_position="pre",
      pooling="mean", type_vocab_size=0, dropout_rate=0.0, attention_dropout_rate=0.0))
  config.num_classes = 10
  config.data.kind = "image_arrays"
  config.data.source = "fashion_mnist"
  config.data.eval_split = "test"
  config.batch_size = 64
  config.eval_batch_size = 500
  config.num_train_steps = 10000
  config.eval_every = 5000
  config.checkpoint_every = 5000
  config.cpu_devices = 2  # on a CPU host: one device per core, data parallel (faster here)
  config.best_metric = "accuracy"
  config.optim.learning_rate = 2e-3
  config.optim.schedule = "cosine"
  config.optim.warmup_steps = 200
  config.optim.b2 = 0.98
  config.optim.weight_decay = 0.05
  return config
