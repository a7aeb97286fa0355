"""ModernBERT-base MLM pretraining, phase 1 (L = 1,024), sized for a TPU v5e-8.

  python train.py --config configs/modernbert_base.py --workdir gs://BUCKET/modernbert_base \\
      --config.data.source=text_corpus/MYCORPUS --config.data.data_dir=gs://BUCKET/data \\
      --config.data.tokenizer=MODERNBERT_TOKENIZER_JSON
  jaxencoder-compile --config configs/modernbert_base.py --topology v5e-8 --steps train

Then phase 2, the context extension: configs/modernbert_base_long.py.

The published shape (Warner et al. 2024; Hugging Face ModernBertConfig): 22 layers, 768
wide, 12 heads, GeGLU 1,152, pre-norm (layer 0 attends to its input unnormalised), no
biases, a global layer every 3rd (0, 3, ..., 21) and a 128-token window elsewhere
(|i - j| <= 64: sliding_window=64), RoPE base 160k on the global layers and 10k on the
local ones, vocabulary 50,368. The recipe: 30% masking, no dropout, WSD (warmup, constant,
1-sqrt decay over the last 10%), best-fit packed rows. bf16 compute (float32 compute
keeps the kernels off), float32 params and Adam state, FSDP over every device, the stack
scanned by period (7 groups of 3 layers, then layer 21) so splash serves every layer of
the train step, MLM logits for the masked rows only, computed 128 positions at a time.
ModernBERT's paper trained phase 1 with the global base at 10k and raised it to 160k for
phase 2; this config keeps the published 160k in both phases (so a converted
ModernBERT-base loads into either): --config.model.rope_base=10000 gives the paper's.

CPU-sized variant, the same pattern (scanned, 4 layers: one period of 3 and layer 3;
best-fit packed, WSD, 30% masking), on the offline Shakespeare text, in minutes here:
  python train.py --config configs/modernbert_base.py:cpu --workdir runs/modernbert_base_cpu

Measured with it (2026-12-04, 2 CPU cores): 200 steps in 2 minutes, best-fit fill 0.992,
train MLM loss 9.93 (steps 1-20) -> 6.44 (181-200), eval loss 6.41, accuracy 8.2%.

Compiled for Cloud TPU on this CPU host (python bench/tpu_compile.py; docs/performance.md,
"Modern encoder recipe"), the train step at batch 256, per chip:

  target  memory           largest batch  attention (train step)  compile
  v5e-8   6.68 of 16 GiB   76 (608)       splash 22/22             77 s
  v5p-8   9.89 of 95 GiB   -              splash 22/22             96 s
  v6e-8   6.32 of 32 GiB   -              splash 22/22            146 s
  h100-8  7.51 of 79 GiB   -              cudnn 8/22 (the local layers' two-sided
                                          windows run xla)          9 s
"""

from jaxencoder.model.config import MODERNBERT
from jaxencoder.train.config import base_config

LONG_LEN = 8_192  # phase 2's rows (modernbert_base_long.py); the table RoPE never reads

UNSCORED = ("sized for a TPU v5e-8 and a bucket corpus: its TPU compiles (memory, "
            "kernels) are in docs/performance.md")


def get_config(arg: str | None = None):
  config = base_config()
  model = config.model
  model.update(MODERNBERT)
  model.num_layers, model.emb_dim, model.num_heads, model.mlp_dim = 22, 768, 12, 1152
  model.vocab_size, model.max_len = 50_368, LONG_LEN
  model.dropout_rate = model.attention_dropout_rate = 0.0
  # remat: save_dots and save_dots_no_batch need 16.1 GiB per v5e chip at 256 (of 16);
  # full needs 6.7 GiB (docs/performance.md, "Modern encoder recipe")
  model.dtype, model.scan_layers, model.remat_policy = "bfloat16", True, "full"
  model.attention_impl = "auto"
  config.mlm_loss_chunk = 128
  config.data.source = "text_corpus/default"
  config.data.seq_len = 1_024
  config.data.packing = "best_fit"
  config.data.mask_rate = 0.3
  config.batch_size = config.eval_batch_size = 256
  config.num_train_steps = 200_000
  config.log_every, config.eval_every, config.checkpoint_every = 100, 10_000, 5_000
  config.optim.learning_rate, config.optim.weight_decay = 8e-4, 1e-5
  config.optim.schedule, config.optim.warmup_steps = "wsd", 3_000
  config.optim.decay_fraction, config.optim.decay_shape = 0.1, "1-sqrt"
  config.mesh_shape = (1, -1, 1)  # FSDP over every device
  config.progress_bar = False
  return cpu_sized(config) if arg == "cpu" else config


def cpu_sized(config):
  """The same recipe at a size 2 CPU cores train in minutes: 4 layers (one scanned period
  of 3 and an unrolled global layer 3), 64 wide, MiniLM's vocabulary, Shakespeare."""
  model = config.model
  model.num_layers, model.emb_dim, model.num_heads, model.mlp_dim = 4, 64, 2, 96
  # max_len: what phase 2's CPU variant reads (RoPE has no table to size)
  model.vocab_size, model.max_len, model.sliding_window = 30_522, 512, 16
  model.dtype = "float32"  # bf16 is emulated on CPUs: slower there, not faster
  config.mlm_loss_chunk = 0
  config.data.source, config.data.seq_len = "shakespeare", 128
  config.data.holdout_every = 50
  config.batch_size, config.eval_batch_size = 16, 32
  config.num_train_steps = 200
  config.log_every, config.eval_every, config.checkpoint_every = 20, 100, 50
  config.optim.learning_rate, config.optim.warmup_steps = 2e-3, 20
  config.mesh_shape = (-1, 1, 1)
  return config
