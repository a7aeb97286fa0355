"""BERT-base MLM pretraining, sized for a TPU v5e-8 / v4-32 or an 8-GPU node.

  python train.py --config configs/mlm_bert_base.py --workdir gs://BUCKET/bert_base \\
      --config.data.source=text_corpus/MYCORPUS --config.data.data_dir=gs://BUCKET/data

A prepared tfds text corpus (python -m jaxencoder.data prepare text_corpus ...)
is read from data_dir. A bucket of text files, a tfds dataset already prepared as
array_record, and a mixture of corpora (README "Corpora bigger than memory"):

  python -m jaxencoder.data prepare text_corpus --source 'gs://BUCKET/web/*.txt' \
      --data-dir gs://BUCKET/data --name web --tokenizer VOCAB
  python -m jaxencoder.data prepare text_corpus --source tfds:wiki40b/en \
      --tfds-data-dir gs://BUCKET/tensorflow_datasets --text-feature text \
      --data-dir gs://BUCKET/data --name wiki --tokenizer VOCAB
  python train.py --config configs/mlm_bert_base.py --workdir gs://BUCKET/bert_base \
      --config.data.data_dir=gs://BUCKET/data --config.data.tokenizer=VOCAB \
      --config.data.sources=text_corpus/web:0.7,text_corpus/wiki:0.3

Token ids are stored once, in shards, and read by range (each process reads only the
rows of its batches); prepare's and the trainer's memory do not grow with the corpus.
bf16 compute, f32 params and Adam state, FSDP over all
devices, scanned layers with dot-saving remat, packed 512-token rows.
Starts on CPU (2026-12-01, 2 cores shared with other jobs, load average ~8), shrunk to
a CPU-sized batch on the offline Shakespeare text:
  python train.py --config configs/mlm_bert_base.py --workdir /tmp/bert_base_cpu \
      --config.data.source=shakespeare --config.data.data_dir=data --config.batch_size=8 \
      --config.eval_batch_size=8 --config.data.seq_len=128 --config.num_train_steps=3 \
      --config.log_every=1 --config.eval_every=3 --config.checkpoint_every=3
setup 12.8 s, first step compiled in 36.8 s; 20-22 s per step (~50 tokens/s); train loss
10.51 -> 9.78 in 3 steps. Accelerator numbers: docs/performance.md (bench/gpu.sh).
"""

from jaxencoder.model.config import EncoderConfig
from jaxencoder.train.config import base_config, model_config

UNSCORED = ("sized for a TPU v5e-8 and a bucket corpus: its TPU compiles (memory, "
            "kernels) are in docs/performance.md")


def get_config():
  config = base_config()
  config.model = model_config(EncoderConfig.preset(
      "base", vocab_size=30522, dtype="bfloat16", scan_layers=True,
      remat_policy="save_dots", attention_impl="auto", attention_dropout_rate=0.0))
  config.data.source = "text_corpus/default"
  config.data.seq_len = 512
  config.data.packing = "pack"
  config.batch_size = 256
  config.eval_batch_size = 256
  config.num_train_steps = 1_000_000
  config.log_every = 100
  config.eval_every = 10_000
  config.checkpoint_every = 5_000
  config.optim.learning_rate = 1e-4
  config.optim.warmup_steps = 10_000
  config.optim.weight_decay = 0.01
  config.mesh_shape = (1, -1, 1)  # FSDP over every device
  config.progress_bar = False
  return config
