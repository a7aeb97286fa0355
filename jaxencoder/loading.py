"""`jaxencoder.load(name_or_path)`: any checkpoint in one call, with the verbs users reach for.

  model = jaxencoder.load("minilm")  # a name, a Hugging Face dir, a run dir, RUN@STEP, gs://
  vectors_NxD = model.embed(["a sentence", ...])    # as sentence-transformers
  out = model.encode(["a sentence"], hidden_states=True)  # token states (+ every layer's)
  labels = jaxencoder.load("runs/sst2").predict(["a fine film"])  # a task run: label names
  out = model.apply(input_ids_BxL, attention_mask_BxL)  # raw arrays -> EncoderOutput

Names and paths are resolved by pretrained/resolver.py (as init_from, the probe, predict,
export and convert resolve them); a run's task model comes from train/predict.py.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np

from jaxencoder.io import paths
from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import ENCODER, Encoder, EncoderOutput
from jaxencoder.pretrained import sentences
from jaxencoder.pretrained.convert import read_run
from jaxencoder.pretrained.resolver import Resolved, resolve
from jaxencoder.tokenizer import Tokenizer
from jaxencoder.train import predict as predict_lib

BATCH = 32  # texts per forward pass


@dataclasses.dataclass
class Encoded:
  """Token states of N texts, each padded to the longest's L tokens (numpy arrays)."""
  input_ids: np.ndarray  # [N, L]
  attention_mask: np.ndarray  # [N, L]; 0 at padding
  last_hidden_state: np.ndarray  # [N, L, D]
  pooled: np.ndarray  # [N, D]: the encoder's own pooling (cfg.pooling), not normalised
  hidden_states: tuple[np.ndarray, ...] | None = None  # layers + 1 of [N, L, D]; 0: embeddings
  attentions: tuple[np.ndarray, ...] | None = None  # layers of [N, H, L, L]


@dataclasses.dataclass(repr=False)
class LoadedModel:
  """A checkpoint read by `load`: its EncoderConfig, Encoder params and tokenizer (None for
  an image or series encoder), what `embed` does with it, and for a task run its
  `predict_lib.Predictor`."""
  source: Resolved
  cfg: EncoderConfig
  params: dict
  tokenizer: Tokenizer | None
  sentence: sentences.SentenceConfig  # embed's pooling, normalisation and length
  predictor: predict_lib.Predictor | None = None
  no_predictor: str = ""  # why there is none

  def __repr__(self) -> str:
    task = f", task {self.predictor.task}" if self.predictor else ""
    return (f"LoadedModel({self.where}: {self.cfg.family}, "
            f"{self.cfg.num_layers} layers x {self.cfg.emb_dim}, {self.cfg.input_kind}{task})")

  def apply(self, inputs, attention_mask=None, token_type_ids=None, **options) -> EncoderOutput:
    """The Encoder on raw arrays: ids [B, L] (or pixels, values); `options` as
    Encoder.__call__ takes them (output_hidden_states, output_attentions, ...)."""
    return Encoder(self.cfg).apply({"params": self.params}, inputs, attention_mask,
                                   token_type_ids, **options)

  def encode(self, texts: Sequence[str], *, hidden_states: bool = False,
             attentions: bool = False, max_length: int | None = None,
             batch_size: int = BATCH) -> Encoded:
    """Token states of `texts` (truncated at `max_length`, by default embed's length);
    `hidden_states`: every layer's, `attentions`: every layer's weights."""
    tokenizer = self._text("encode")
    if not texts:
      raise ValueError(".encode: no texts")
    batch_size = min(batch_size, len(texts))
    batch = tokenizer.encode_batch(list(texts), max_length=max_length or self.max_length)
    types = batch["token_type_ids"] if self.cfg.type_vocab_size else None
    outs = [jax.device_get(_forward(self.cfg, self.params, *_rows(
                (batch["input_ids"], batch["attention_mask"], types), start, batch_size),
                hidden_states, attentions))
            for start in range(0, len(texts), batch_size)]
    n = len(texts)
    join = lambda parts: np.concatenate(parts)[:n]
    per_layer = lambda name: tuple(map(join, zip(*(getattr(o, name) for o in outs))))
    return Encoded(batch["input_ids"], batch["attention_mask"],
                   join([o.last_hidden_state for o in outs]), join([o.pooled for o in outs]),
                   per_layer("hidden_states") if hidden_states else None,
                   per_layer("attentions") if attentions else None)

  def embed(self, texts: Sequence[str], *, batch_size: int = BATCH,
            max_length: int | None = None, normalize: bool | None = None,
            progress: bool = False) -> np.ndarray:
    """Sentence embeddings [N, D] as sentence-transformers gives them
    (`pretrained.embed`): the checkpoint's pooling, length and normalisation (a run's:
    its cfg.pooling, data.seq_len, L2-normalised)."""
    return sentences.embed_with(texts, (self.cfg, self.params, self._text("embed")),
                                self.sentence, batch_size=batch_size, max_length=max_length,
                                normalize=normalize, progress=progress)

  def predict(self, texts: Sequence[str], *, batch_size: int = BATCH) -> list[str] | np.ndarray:
    """A task run's prediction per text: label names (classify), values (regression),
    tagged words (token_classify), outputs (seq2seq), or pooled vectors [N, D]."""
    result = self.predictions(texts, batch_size=batch_size).outputs
    if isinstance(result, np.ndarray):
      return result
    return [predict_lib.prediction_of(output, text) for output, text in zip(result, texts)]

  def predictions(self, texts: Sequence[str], *, scores: bool = False,
                  batch_size: int = BATCH) -> predict_lib.Predictions:
    """`predict_lib.predictions`: outputs, and with `scores` each class's (named)."""
    if self.predictor is None:
      raise ValueError(f"{self.where}: {self.no_predictor}; .embed and .encode read it")
    return predict_lib.predictions(self.predictor, list(texts), batch_size=batch_size,
                                   scores=scores)

  @property
  def where(self) -> str:
    """The name or path it was loaded from (RUN@STEP with its step)."""
    step = f"@{self.source.step}" if self.source.step is not None else ""
    return (self.source.name or self.source.path) + step

  @property
  def max_length(self) -> int:
    """Tokens kept per text: the checkpoint's length, within the model's positions."""
    return min(self.sentence.max_seq_length or self.cfg.max_positions, self.cfg.max_positions)

  def _text(self, verb: str) -> Tokenizer:
    if self.tokenizer is None:
      raise ValueError(f"{self.where}: an {self.cfg.input_kind} encoder; .{verb} reads "
                       "text (.apply takes its arrays)")
    return self.tokenizer


def load(name_or_path) -> LoadedModel:
  """The checkpoint `name_or_path` names: a registered name ("minilm"), a Hugging Face
  directory (any supported family), a run directory (its newest step that restores) or
  RUN@STEP, local or gs://. Anything else is one line saying what it takes."""
  where = resolve(name_or_path, strict=True)
  if where.kind == "hf":
    with paths.local_copy(where.path) as local:
      cfg, params, tokenizer, sentence = sentences.sentence_model(local)
    return LoadedModel(where, cfg, params, tokenizer, sentence,
                       no_predictor="a Hugging Face encoder, not a run trained with a task")
  return _load_run(where)


def _load_run(where: Resolved) -> LoadedModel:
  """A run directory: with its task's Predictor where predict serves the task."""
  config = RunDir.open(where.path).read_config(where.step)
  p, why = None, "a checkpoint without a task (converted, or pretraining only)"
  if "task" in config:
    try:
      p = predict_lib.load(where.path, where.step)
    except predict_lib.UnsupportedRun as e:
      why = str(e).removeprefix(f"{where.path}: ")
  if p is not None and ENCODER in p.params:
    cfg, params, tokenizer, seq_len = p.cfg, p.params[ENCODER], p.tokenizer, p.seq_len
  else:
    cfg, params, tokenizer = read_run(where.path, step=where.step)
    seq_len = (config.get("data") or {}).get("seq_len")
  sentence = sentences.SentenceConfig(max_seq_length=seq_len, pooling=cfg.pooling,
                                      normalize=True)
  return LoadedModel(where, cfg, params, tokenizer, sentence, p, "" if p else why)


def _rows(arrays, start: int, size: int) -> list[np.ndarray | None]:
  """Rows [start, start + size) of each array, zero-padded to `size` rows (one compile)."""
  def take(x):
    if x is None:
      return None
    part = x[start:start + size]
    return np.pad(part, ((0, size - len(part)),) + ((0, 0),) * (part.ndim - 1))
  return [take(x) for x in arrays]


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _forward(cfg: EncoderConfig, params, ids_BxL, mask_BxL, types_BxL, hidden: bool,
             attentions: bool) -> EncoderOutput:
  return Encoder(cfg).apply({"params": params}, ids_BxL, mask_BxL, types_BxL,
                            output_hidden_states=hidden, output_attentions=attentions)
