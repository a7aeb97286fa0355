"""Classification: `classify` (one class per text, image or series, on the pooled vector),
`token_classify` (a tag per token), `multilabel` (`num_classes` sigmoid outputs) and
`multiple_choice` (texts [B, C, L], one score each).

text_records columns ([optional]) and arrays beyond the text ones:
  multilabel       text, labels, [text_b]                labels [C] float32 (multi-hot)
  multiple_choice  text, choice_0 .. choice_{C-1}, label  text arrays [C, L] (text, choice_c)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder.data import records
from jaxencoder.data.readers import DataError, as_text
from jaxencoder.model.heads import EncoderClassifier, EncoderMultipleChoice
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model, f1_scores,
                                   loss_summary, mean_loss, per_example, record_shapes,
                                   text_shapes, weighted_ce)


def confusion(logits, labels, weights, num_classes) -> Sums:
  """Per-class true/false positives and false negatives (for macro F1)."""
  pred = jax.nn.one_hot(jnp.argmax(logits, -1), num_classes) * weights[..., None]
  gold = jax.nn.one_hot(labels, num_classes) * weights[..., None]
  axes = tuple(range(pred.ndim - 1))
  return {"tp": jnp.sum(pred * gold, axes), "fp": jnp.sum(pred * (1 - gold), axes),
          "fn": jnp.sum((1 - pred) * gold, axes)}


def multilabel_sums(logits_BxC, labels_BxC, weights_B) -> Sums:
  """Sigmoid BCE (mean over the C labels); a label is predicted when its logit > 0.
  `correct`: every label right; `label_tp/fp/fn` [C] for micro and macro F1."""
  w_B = weights_B.astype(jnp.float32)
  logits_BxC = logits_BxC.astype(jnp.float32)
  bce_B = optax.sigmoid_binary_cross_entropy(logits_BxC, labels_BxC).mean(-1)
  pred_BxC, gold_BxC = (logits_BxC > 0).astype(jnp.float32), labels_BxC.astype(jnp.float32)
  exact_B = jnp.all(pred_BxC == gold_BxC, -1)
  count = lambda x_BxC: jnp.sum(x_BxC * w_B[:, None], 0)
  return {"loss_sum": jnp.sum(bce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum(exact_B * w_B), "label_tp": count(pred_BxC * gold_BxC),
          "label_fp": count(pred_BxC * (1 - gold_BxC)),
          "label_fn": count((1 - pred_BxC) * gold_BxC)}


def multilabel_features(tokenizer, seq_len: int, *, num_labels: int):
  def fn(ex):
    labels_C = np.zeros(num_labels, np.float32)
    labels_C[np.asarray(ex["labels"], np.int64)] = 1.0
    enc = records.encode(tokenizer, as_text(ex["text"]), records.optional(ex, "text_b"), seq_len)
    return {**enc, "labels": labels_C, "example_weights": np.float32(1.0)}
  return fn


def multiple_choice_features(tokenizer, seq_len: int):
  """One (text, choice_c) pair per choice: text arrays [C, L]; `labels` the right c."""
  def fn(ex):
    choices = sorted((k for k in ex if k.startswith("choice_")), key=lambda k: int(k[7:]))
    label = int(ex["label"])
    if not 0 <= label < len(choices):
      raise DataError(f"{as_text(ex['origin'])}: label {label} is not a choice index "
                      f"(0..{len(choices) - 1})")
    text = as_text(ex["text"])
    rows = [records.encode(tokenizer, text, as_text(ex[c]), seq_len) for c in choices]
    return {**records.stacked(rows), "labels": np.int32(label), "example_weights": np.float32(1.0)}
  return fn


CHOICES = 4  # choices per question where no data says it (jaxencoder-compile's shapes)


class Classification(Family):
  names = ("classify", "token_classify", "multilabel", "multiple_choice")
  options = {"num_classes": 2}  # classes (labels) where the data does not name them
  record_columns = {"multilabel": ("text", "labels"),
                    "multiple_choice": ("text", "choice_0", "label")}
  predicts = {"classify": "lines", "multilabel": "lines", "token_classify": "words"}
  scored = ("classify", "multilabel")
  min_classes = {"classify": 2, "token_classify": 2, "multilabel": 1}  # multilabel: yes/no each

  def build(self, name, cfg, *, num_classes=2) -> Task:
    input_key = INPUT_KEYS[cfg.input_kind]
    if name == "multilabel":
      model = EncoderClassifier(cfg, num_classes)
      def multilabel_loss(params, batch, rng, train):
        logits_BxC = apply_model(model, params, batch, input_key, rng, train)
        sums = multilabel_sums(logits_BxC, batch["labels"], batch["example_weights"])
        return mean_loss(sums), sums
      return Task(name, model, input_key, multilabel_loss, self)
    if name == "multiple_choice":
      model = EncoderMultipleChoice(cfg)
      def choice_loss(params, batch, rng, train):
        logits_BxC = apply_model(model, params, batch, input_key, rng, train)
        sums = weighted_ce(logits_BxC, batch["labels"], batch["example_weights"])
        return mean_loss(sums), sums
      return Task(name, model, input_key, choice_loss, self)
    token_level = name == "token_classify"
    model = EncoderClassifier(cfg, num_classes, token_level=token_level)
    weight_key = "label_weights" if token_level else "example_weights"
    def loss_fn(params, batch, rng, train):
      logits = apply_model(model, params, batch, input_key, rng, train)
      weights = batch.get(weight_key, jnp.ones(batch["labels"].shape, jnp.float32))
      sums = weighted_ce(logits, batch["labels"], weights)
      sums.update(confusion(logits, batch["labels"], weights.astype(jnp.float32), num_classes))
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss, accuracy (multilabel: every label right) and macro F1 (multilabel: also micro)."""
    out = loss_summary(sums)
    if "tp" in sums:
      out["f1_macro"] = f1_scores(sums["tp"], sums["fp"], sums["fn"])[1]
    if "label_tp" in sums:
      out["f1_micro"], out["f1_macro"] = f1_scores(sums["label_tp"], sums["label_fp"],
                                                   sums["label_fn"])
    return out

  def record_features(self, name, tokenizer, seq_len, *, num_labels):
    if name == "multilabel":
      return multilabel_features(tokenizer, seq_len, num_labels=num_labels)
    return multiple_choice_features(tokenizer, seq_len)

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    if not kind.records or name not in self.record_columns:
      return None
    L = config.data.seq_len
    if name == "multilabel":
      arrays = {**text_shapes((batch, L), config),
                "labels": ((batch, config.num_classes), np.float32)}
    else:
      arrays = {**text_shapes((batch, group or CHOICES, L), config),
                **per_example(batch, labels=np.int32)}
    return record_shapes(arrays, batch, train=train)

  def predict(self, name, predictor, batch, args, lines):
    logits = np.asarray(predictor.model.apply({"params": predictor.params}, *args))
    label = predictor.label
    if name == "classify":
      return [f"{label(int(c))}\t{line}" for c, line in zip(logits.argmax(-1), lines)]
    if name == "multilabel":  # logit > 0 <=> sigmoid > 0.5
      return [f"{','.join(label(int(c)) for c in np.flatnonzero(row > 0))}\t{line}"
              for row, line in zip(logits, lines)]
    tags_BxL, first_BxW = logits.argmax(-1), batch["first_subword_index"]
    return [" ".join(f"{w}/{label(int(tags_BxL[b, first_BxW[b, i]]))}"
                     for i, w in enumerate(line.split())
                     if i < first_BxW.shape[1] and first_BxW[b, i] >= 0)
            for b, line in enumerate(lines)]

  def scores(self, name, predictor, args):
    """classify: the softmax over classes; multilabel: each label's own sigmoid."""
    logits_BxC = np.asarray(predictor.model.apply({"params": predictor.params}, *args),
                            np.float64)
    if name == "multilabel":
      return 1.0 / (1.0 + np.exp(-logits_BxC))
    exp_BxC = np.exp(logits_BxC - logits_BxC.max(-1, keepdims=True))
    return exp_BxC / exp_BxC.sum(-1, keepdims=True)


FAMILY = Classification()
