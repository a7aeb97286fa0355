"""ModernBERT-base MLM pretraining, phase 2: context extension to L = 8,192 from phase 1.

  python train.py --config configs/modernbert_base_long.py --workdir gs://BUCKET/modernbert_long \\
      --config.init_from=gs://BUCKET/modernbert_base \\
      --config.data.source=text_corpus/MYCORPUS --config.data.data_dir=gs://BUCKET/data
  jaxencoder-compile --config configs/modernbert_base_long.py --topology v5e-8 --steps train

`init_from` takes phase 1's encoder (configs/modernbert_base.py, trained at 1,024): its
params in the same scanned layout, its tokenizer; the optimizer and the step start afresh.
The global layers' RoPE base is this config's (`model_overrides`: 160k; pass
--config.model.rope_base=... to choose another), the local layers keep 10k. Rows of 8,192
tokens, best-fit packed (a document longer than that is cut into pieces of 8,192), 64 of
them per step: 8 per v5e chip. At this length the masked positions of a batch (8 rows x
~3,070 on a chip) would need 4.7 GB of float32 logits and as much again for their
gradient: the MLM loss runs 128 positions at a time (`mlm_loss_chunk`).

CPU-sized variant: phase 1's (configs/modernbert_base.py:cpu) at 512 tokens, from its run:
  python train.py --config configs/modernbert_base.py:cpu --workdir runs/modernbert_base_cpu
  python train.py --config configs/modernbert_base_long.py:cpu --workdir runs/modernbert_long_cpu \\
      --config.init_from=runs/modernbert_base_cpu
Measured (2026-12-04, 2 CPU cores, beside other work): best-fit fill 0.999 at 512 tokens,
encoder and MLM head loaded from phase 1's step 200; train MLM loss 6.40 over steps 1-10
(phase 1 ended at 6.44: no restart from log(vocab) = 10.3), eval loss 6.34 at step 40.

Compiled for Cloud TPU on this CPU host (python bench/tpu_compile.py; docs/performance.md,
"Modern encoder recipe"), the train step at batch 64, per chip (remat full: save_dots
needs 18.3 GiB per v5e chip already at batch 40):

  target  memory            largest batch  attention (train step)  compile
  v5e-8   13.73 of 16 GiB   9 (72)         splash 22/22             85 s
  v5p-8   19.16 of 95 GiB   -              splash 22/22             99 s
  v6e-8   11.76 of 32 GiB   -              splash 22/22            233 s
  h100-8  70.75 of 79 GiB   -              cudnn 8/22 (local layers xla)   9 s
"""

import importlib.util
import pathlib


def phase1(arg: str | None):
  """configs/modernbert_base.py's config (the same architecture and recipe)."""
  path = pathlib.Path(__file__).with_name("modernbert_base.py")
  spec = importlib.util.spec_from_file_location("modernbert_base", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)

UNSCORED = ("sized for a TPU v5e-8 and a bucket corpus at 8,192 tokens: its TPU compiles "
            "(memory, kernels) are in docs/performance.md")


def get_config(arg: str | None = None):
  config = phase1(arg)
  config.model_overrides = ("rope_base",)  # the new global base wins over init_from's
  config.model.rope_base = 160_000.0
  config.mlm_loss_chunk = 128
  if arg == "cpu":
    config.data.seq_len = 512
    config.batch_size, config.eval_batch_size = 4, 8
    config.num_train_steps, config.optim.warmup_steps = 40, 4
    config.log_every, config.eval_every, config.checkpoint_every = 10, 40, 20
    return config
  config.data.seq_len = 8_192
  config.batch_size = config.eval_batch_size = 64
  config.num_train_steps = 50_000
  config.log_every, config.eval_every, config.checkpoint_every = 50, 5_000, 2_500
  config.optim.learning_rate, config.optim.warmup_steps = 3e-4, 500
  return config
