"""A run as a sentence-transformers directory (`jaxencoder-convert --from RUN --to DIR`):
the run's task says how its loss compares the pooled vectors (`Family.embedding`), the
run its length, pooling and tokenizer; pretrained/convert.py writes the directory.

  SentenceTransformer(DIR).encode(texts) == jaxencoder.load(RUN).embed(texts)
"""

from __future__ import annotations

from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.restore_targets import stored_config
from jaxencoder.pretrained import convert as convert_lib
from jaxencoder.pretrained.resolver import is_hf_dir, resolve
from jaxencoder.pretrained.sentences import SentenceConfig, lowercases
from jaxencoder.tasks import registry
from jaxencoder.tokenizer import Tokenizer, run_tokenizer

FLAG = "--sentence-transformers"


def convert(source, target, *, sentence_transformers: bool = False, **options) -> str:
  """`convert_lib.convert(source, target, **options)`; an embedding run (its task trains
  sentence embeddings, e.g. contrastive) or, with `sentence_transformers`, any text run
  becomes a sentence-transformers directory (not with merge_lora / adapters_only, which
  write jaxencoder files, unless asked)."""
  jaxencoder_files = options.get("merge_lora") or options.get("adapters_only")
  sentence = (sentence_config(source, forced=sentence_transformers)
              if sentence_transformers or not jaxencoder_files else None)
  return convert_lib.convert(source, target, sentence=sentence, **options)


def sentence_config(source, *, forced: bool = False) -> SentenceConfig | None:
  """What `jaxencoder.load(source).embed` computes, as a sentence-transformers directory
  says it: the run's pooling, data.seq_len, lower-casing, and from its task's loss the
  similarity (cosine: normalised) and Matryoshka sizes. None for a run whose task trains
  no embeddings (unless `forced`: cosine and normalised, as `embed` is) or a Hugging Face
  `source`."""
  where = resolve(source)
  if is_hf_dir(where.path):
    if forced:
      raise ValueError(f"{FLAG}: {source} is a Hugging Face directory; it writes a run "
                       "trained here as one (SRC: a run directory)")
    return None
  run = RunDir.open(where.path)
  config = run.read_config(where.step)
  embedding = None
  if "task" in config:
    name, family = registry.owner(config)
    embedding = family.embedding(name, config)
  if embedding is None and not forced:
    return None
  cfg = stored_config(run, where.step)
  if cfg.input_kind != "text":
    raise ValueError(f"{source}: an {cfg.input_kind} encoder; a sentence-transformers "
                     "directory embeds text")
  seq_len = (config.get("data") or {}).get("seq_len") or cfg.max_positions
  tokenizer = Tokenizer.from_file(run_tokenizer(run, fix=f"drop {FLAG}"))
  return SentenceConfig(
      max_seq_length=min(seq_len, cfg.max_positions), do_lower_case=lowercases(tokenizer),
      pooling=cfg.pooling, normalize=embedding is None or embedding.similarity == "cosine",
      similarity=embedding.similarity if embedding else "cosine",
      matryoshka_dims=embedding.nested_dims if embedding else ())
