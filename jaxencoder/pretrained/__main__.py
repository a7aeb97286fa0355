"""CLI: python -m jaxencoder.pretrained convert --from SRC --to DST.

SRC a Hugging Face BERT directory (config.json + model.safetensors): DST becomes a
jaxencoder checkpoint directory for `train.py --config.init_from=DST`.
SRC a jaxencoder checkpoint directory (written by this command, or a train.py
workdir, or its checkpoints/ folder): DST becomes a Hugging Face BERT directory.
"""

from __future__ import annotations

import argparse
import pathlib

from jaxencoder.config import EncoderConfig
from jaxencoder.pretrained import hf_checkpoint, orbax_dir


def is_hf_dir(path: pathlib.Path) -> bool:
  return (path / hf_checkpoint.CONFIG).is_file()


def convert(source, target, *, scan_layers: bool = False) -> str:
  """Converts in the direction SRC's contents imply; returns a one-line summary."""
  source, target = pathlib.Path(source), pathlib.Path(target)
  if is_hf_dir(source):
    cfg, params, tokenizer = hf_checkpoint.load(source, scan_layers=scan_layers)
    orbax_dir.write(target, cfg, params, tokenizer)
    return (f"wrote jaxencoder checkpoint {target}/checkpoints; train with "
            f"--config.init_from={target} {model_flags(cfg)}")
  cfg, params, tokenizer = orbax_dir.read(source)
  hf_checkpoint.save(target, cfg, params, tokenizer)
  return f"wrote Hugging Face BERT directory {target}"


ARCHITECTURE = ("vocab_size", "type_vocab_size", "num_layers", "emb_dim", "num_heads",
                "mlp_dim", "max_len", "activation", "norm_eps", "pooling", "pooler_dense",
                "scan_layers")


def model_flags(cfg: EncoderConfig) -> str:
  """The `--config.model.X=Y` flags that make a training config build this architecture."""
  return " ".join(f"--config.model.{name}={getattr(cfg, name)}" for name in ARCHITECTURE)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m jaxencoder.pretrained", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("convert", help="HF BERT dir <-> jaxencoder checkpoint dir")
  p.add_argument("--from", dest="source", required=True)
  p.add_argument("--to", dest="target", required=True)
  p.add_argument("--scan_layers", action="store_true",
                 help="HF -> jaxencoder: write the scanned layout (for scan_layers=True configs)")
  args = parser.parse_args(argv)
  print(convert(args.source, args.target, scan_layers=args.scan_layers))


if __name__ == "__main__":
  main()
