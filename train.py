"""Trains an encoder: python train.py --config configs/NAME.py --workdir DIR [--config.key=value ...]

The same as `jaxencoder-train` / `python -m jaxencoder.train` (jaxencoder/train/__main__.py).
Rerunning with the same workdir resumes from its latest checkpoint.
"""

from jaxencoder.train.__main__ import main

if __name__ == "__main__":
  main()
