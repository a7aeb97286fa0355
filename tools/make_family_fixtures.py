"""Writes tests/fixtures/families/<family>/: tiny random transformers models and their outputs.

Needs torch and transformers (not jaxencoder), e.g. in a separate venv:

  python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch==2.13.0 transformers
  /tmp/refenv/bin/python tools/make_family_fixtures.py [--families roberta vit ...]

Each family directory is what save_pretrained writes (config.json, model.safetensors)
plus reference.npz: the inputs (input_ids, attention_mask [B, L] int32 with right
padding in rows 1 and 2, token_type_ids for ELECTRA; pixel_values [B, C, H, W] float32
for ViT) and the model's float32 outputs in eval mode: last_hidden_state [B, L, D]
(padding rows included), pooler_output [B, D] where the model has a pooler, and logits
[B, L, V] for a masked LM (last_hidden_state is then its base model's).

Every parameter (LayerNorm scales and biases too) gets N(0, NOISE) added after init, so
that no tensor is the identity or zero and a misplaced one changes the outputs.
ModernBERT: 3 layers, layer 0 global and 1, 2 local (|i - j| <= 3) with their own RoPE
bases; its sequences (20 tokens) are longer than the window.
modernbert_base_shape: ModernBERT-base's pattern at a tiny width, as a masked LM: 22
layers, global every 3rd (0, 3, ..., 21: 7 periods of 3 and layer 21 left over), the
published RoPE bases (160k global, 10k local), no biases, a window (|i - j| <= 3) the
20-token rows exceed; 16 wide, 2 heads of 8, GeGLU 24, vocabulary 211 (~300 KB in all).
"""

from __future__ import annotations

import argparse
import pathlib
import shutil

import numpy as np
import torch
import transformers

NOISE = 0.1
BATCH, SEQ_LEN, LENGTHS = 3, 20, (20, 13, 6)  # real tokens per row: rows 1, 2 right-padded
VOCAB = 64
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def text_inputs(pad_id: int, types: bool, vocab: int = VOCAB) -> dict[str, np.ndarray]:
  """Random ids (never a special id 0..3) right-padded with `pad_id`; pair-style types."""
  rng = np.random.RandomState(0)
  ids_BxL = rng.randint(4, vocab, (BATCH, SEQ_LEN))
  mask_BxL = np.zeros_like(ids_BxL)
  for row, length in enumerate(LENGTHS):
    mask_BxL[row, :length] = 1
    ids_BxL[row, length:] = pad_id
  out = {"input_ids": ids_BxL.astype(np.int32), "attention_mask": mask_BxL.astype(np.int32)}
  if types:  # second half of each row's real tokens is segment 1
    index_BxL = np.arange(SEQ_LEN)[None, :]
    half_Bx1 = np.array(LENGTHS)[:, None] // 2
    out["token_type_ids"] = ((index_BxL >= half_Bx1) & (mask_BxL == 1)).astype(np.int32)
  return out


def family_model(family: str) -> tuple[torch.nn.Module, dict[str, np.ndarray]]:
  """(random-weight eval model, its inputs) of one family."""
  t = transformers
  if family == "roberta":  # pad_token_id=1: positions start at padding_idx + 1 = 2
    config = t.RobertaConfig(vocab_size=VOCAB, **SMALL, max_position_embeddings=24,
                             type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
    return t.RobertaModel(config), text_inputs(pad_id=1, types=False)
  if family == "distilbert":
    config = t.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                max_position_embeddings=24, pad_token_id=0)
    return t.DistilBertModel(config), text_inputs(pad_id=0, types=False)
  if family == "electra":  # the discriminator encoder: 16-wide embeddings projected to 32
    config = t.ElectraConfig(vocab_size=VOCAB, embedding_size=16, **SMALL,
                             max_position_embeddings=24, type_vocab_size=2, pad_token_id=0)
    return t.ElectraModel(config), text_inputs(pad_id=0, types=True)
  if family == "modernbert":  # 2 heads of 16: 8 RoPE frequencies per head
    config = t.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=2, local_attention=6, global_attn_every_n_layers=3,
        global_rope_theta=1000.0, local_rope_theta=50.0, max_position_embeddings=64,
        hidden_activation="gelu", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2, attn_implementation="eager")
    return t.ModernBertModel(config), text_inputs(pad_id=0, types=False)
  if family == "modernbert_base_shape":  # ModernBertConfig's defaults are base's: no biases
    config = t.ModernBertConfig(
        vocab_size=211, hidden_size=16, intermediate_size=24, num_hidden_layers=22,
        num_attention_heads=2, local_attention=6, global_attn_every_n_layers=3,
        global_rope_theta=160_000.0, local_rope_theta=10_000.0, max_position_embeddings=64,
        hidden_activation="gelu", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2, attn_implementation="eager")
    return t.ModernBertForMaskedLM(config), text_inputs(pad_id=0, types=False, vocab=211)
  if family == "vit":  # a 4 x 3 patch grid (non-square) + [CLS]
    config = t.ViTConfig(image_size=[32, 24], patch_size=8, num_channels=3, **SMALL)
    rng = np.random.RandomState(0)
    pixels_BxCxHxW = rng.uniform(-1, 1, (BATCH, 3, 32, 24)).astype(np.float32)
    return t.ViTModel(config), {"pixel_values": pixels_BxCxHxW}
  raise ValueError(f"unknown family {family!r}")


def outputs(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """float32 last_hidden_state (of the base model), pooler_output and logits where present."""
  tensors = {k: torch.as_tensor(v if v.dtype == np.float32 else v.astype(np.int64))
             for k, v in inputs.items()}
  with torch.no_grad():
    out = model.base_model(**tensors)
    logits = model(**tensors).logits if model.base_model is not model else None
  arrays = {"last_hidden_state": out.last_hidden_state, "pooler_output": getattr(
      out, "pooler_output", None), "logits": logits}
  return {k: v.numpy().astype(np.float32) for k, v in arrays.items() if v is not None}


def write_family(family: str, root: pathlib.Path) -> pathlib.Path:
  torch.manual_seed(0)
  model, inputs = family_model(family)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * NOISE)
  model = model.float().eval()
  arrays = dict(inputs, **outputs(model, inputs))
  directory = root / family
  shutil.rmtree(directory, ignore_errors=True)
  model.save_pretrained(directory)
  np.savez_compressed(directory / "reference.npz", **arrays,
                      versions=np.array([f"torch {torch.__version__}",
                                         f"transformers {transformers.__version__}"]))
  size = sum(f.stat().st_size for f in directory.iterdir()) / 1024
  print(f"wrote {directory} ({size:.0f} KiB): "
        + ", ".join(f"{k} {v.shape}" for k, v in arrays.items()))
  return directory


FAMILIES = ("roberta", "distilbert", "electra", "modernbert", "modernbert_base_shape", "vit")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
  parser.add_argument("--out", default="tests/fixtures/families")
  args = parser.parse_args(argv)
  for family in args.families:
    write_family(family, pathlib.Path(args.out))


if __name__ == "__main__":
  main()
