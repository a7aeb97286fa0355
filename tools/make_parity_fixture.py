"""Writes tests/fixtures/minilm_reference.npz: PyTorch BertModel outputs on real sentences.

Needs torch and transformers (not jaxencoder), e.g. in a separate venv:

  python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch==2.13.0 transformers
  /tmp/refenv/bin/python tools/make_parity_fixture.py --model DIR

DIR is the all-MiniLM-L6-v2 directory (`jaxencoder.tokenizer.default_tokenizer_path()`
in the jaxencoder venv). The fixture holds 4 single sentences and 2 pairs (type ids
0/1), right-padded to a common length <= 16; its arrays: input_ids, attention_mask,
token_type_ids [6, L] int32; last_hidden_state [6, L, 384], pooler_output [6, 384],
embeddings [6, 384] (mean pooling over real tokens + L2 norm), all float32.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch
import transformers

SINGLES = ["The cat sat on the mat.",
           "A quick brown fox jumps over the lazy dog near the river bank today.",
           "Hello!",
           "JAX compiles numerical programs with XLA."]
PAIRS = [("How old are you?", "I am six."),
         ("Where is the station?", "Turn left at the bank.")]
MAX_LENGTH = 16


def reference_outputs(model_dir: str, max_length: int = MAX_LENGTH) -> dict[str, np.ndarray]:
  """Token ids and BertModel outputs (float32, eval mode) for SINGLES then PAIRS."""
  tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.BertModel.from_pretrained(model_dir).eval()
  singles = tokenizer(SINGLES, padding="max_length", truncation=True, max_length=max_length,
                      return_tensors="pt")
  pairs = tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS], padding="max_length",
                    truncation=True, max_length=max_length, return_tensors="pt")
  batch = {k: torch.cat([singles[k], pairs[k]]) for k in
           ("input_ids", "attention_mask", "token_type_ids")}
  length = int(batch["attention_mask"].sum(1).max())  # trim the all-padding tail
  batch = {k: v[:, :length] for k, v in batch.items()}
  with torch.no_grad():
    out = model(**batch)
  mask_BxLx1 = batch["attention_mask"][..., None].float()
  mean_BxD = (out.last_hidden_state * mask_BxLx1).sum(1) / mask_BxLx1.sum(1).clamp(min=1e-9)
  embeddings_BxD = torch.nn.functional.normalize(mean_BxD, dim=-1)
  arrays = {k: v.numpy().astype(np.int32) for k, v in batch.items()}
  arrays.update(last_hidden_state=out.last_hidden_state.numpy().astype(np.float32),
                pooler_output=out.pooler_output.numpy().astype(np.float32),
                embeddings=embeddings_BxD.numpy().astype(np.float32))
  return arrays


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", required=True, help="the all-MiniLM-L6-v2 directory")
  parser.add_argument("--out", default="tests/fixtures/minilm_reference.npz")
  args = parser.parse_args(argv)
  torch.manual_seed(0)
  arrays = reference_outputs(args.model)
  texts = SINGLES + [f"{a} ||| {b}" for a, b in PAIRS]
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(out, texts=np.array(texts), **arrays,
                      versions=np.array([f"torch {torch.__version__}",
                                         f"transformers {transformers.__version__}"]))
  print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): "
        + ", ".join(f"{k} {v.shape}" for k, v in arrays.items()))


if __name__ == "__main__":
  main()
