"""A small ViT on Fashion-MNIST (28x28x1) with a convolutional stem, fetched via apt.

  python train.py --config configs/vit_fashion_mnist.py --workdir runs/vit

Fetched (apt-get download dataset-fashion-mnist) and prepared on first use. Two 3x3
convolutions of stride 2 (32 and 64 channels, GELU) turn the image into a 7x7 grid of
64-channel tokens (1x1 patches), + [CLS]; then 2 pre-norm blocks of width 64.
Measured 2026-12-01 on the 2-core CPU machine, standard split (60k train / 10k test):
test accuracy 0.891 at step 7000 (0.871 at 3500), 8 min 59 s wall including setup (data
prepared) and both evals, load average 2.5-3 (other work on the cores).
The goal of >= 0.90 is NOT met. Same run, other settings (all 2026-12-01, same machine):
  plain ViT, 4x4 patches, 6000 steps          0.870   7 min 51 s
  one stride-1 stem conv (32), 4x4 patches    0.879   8 min 43 s
  this config + --config.data.random_flip=True 0.891   8 min 37 s
  batch 32, 18000 steps, lr 1.5e-3, flip      0.892   9 min 10 s
  mlp_dim 256: 0.086 s/step, > 10 min for 7000 steps (stopped)
Train accuracy ends at 0.93, so more steps or width would help, but not within 10 min.
Baseline (bench/baselines_vision_series.py): logistic regression on raw pixels 0.842.
"""

from jaxencoder.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config


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
  config.num_train_steps = 7000
  config.eval_every = 3500
  config.checkpoint_every = 3500
  config.best_metric = "accuracy"
  config.optim.learning_rate = 2e-3
  config.optim.schedule = "cosine"
  config.optim.warmup_steps = 200
  config.optim.b2 = 0.98
  config.optim.weight_decay = 0.05
  return config
