"""Activation patching (`jaxencoder-probe --patch PAIRS`): where a model with an MLM head
uses the information that tells two minimal-pair sentences apart.

PAIRS is JSON lines, one pair a line: `clean` and `corrupted` text of equal token length,
each with one [MASK], and `target_clean` / `target_corrupted`, the two candidate words at
the mask (one word piece each); any other field (`template`) is kept for grouping:

  {"clean": "the keys to the cabinet [MASK] here .", "corrupted": "the key to the cabinet
   [MASK] here .", "target_clean": "are", "target_corrupted": "is"}

The metric is the logit difference LD = logit(target_clean) - logit(target_corrupted) at
the mask. Each clean activation is patched into the corrupted run (model/interventions.py):
the residual stream at one layer and position (`layer_position`), or one head's output at
one layer, all positions (`layer_head`); recovered fraction = (LD_patched - LD_corrupt) /
(LD_clean - LD_corrupt) of the pairs' mean LDs: 0 = nothing of the difference comes back,
1 = all of it. Positions are aligned by index, so pairs are grouped by template and token
length; `layer_position` is the largest group's, labelled by its first pair's tokens.
Layers count blocks: row n is the output of block n + 1 (layer 0, the embeddings, is not
patched). The patched runs are batched: one run per pair chunk and layer covers every
position (or head).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.data import readers
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.interventions import Interventions
from jaxencoder.probing import objectives, probe_report

FIELDS = ("clean", "corrupted", "target_clean", "target_corrupted")
CHUNK_ROWS = 256  # patched rows per forward pass (pairs x positions, or pairs x heads)


@dataclasses.dataclass
class PairGroup:
  """P pairs of one template and token length L, tokenised."""
  name: str  # "template, L tokens"
  clean_PxL: np.ndarray
  corrupted_PxL: np.ndarray
  attention_mask_PxL: np.ndarray
  token_type_ids_PxL: np.ndarray
  mask_index_P: np.ndarray
  target_clean_P: np.ndarray  # token ids
  target_corrupted_P: np.ndarray
  tokens: list[str]  # the first pair's clean tokens: position labels
  lines: list[int]  # 1-based line numbers in PAIRS


def read_pairs(path) -> list[dict]:
  """The pairs of a JSON-lines file; a ValueError naming the line of a malformed one."""
  out = [{**pair, "line": number}
         for number, pair in readers.json_lines(path, FIELDS, prefix="--patch ")]
  if not out:
    raise ValueError(f"--patch {path}: no pairs (JSON lines with {', '.join(FIELDS)})")
  return out


def group_pairs(tokenizer, pairs: list[dict], where: str = "--patch") -> list[PairGroup]:
  """Tokenised pairs grouped by template and length, largest group first; a ValueError
  naming the pair's line when its sentences differ in length, lack one shared [MASK]
  position, or a target is not one word piece."""
  rows = {}
  for pair in pairs:
    clean, corrupted = (tokenizer.encode(pair[k]) for k in ("clean", "corrupted"))
    at = f"{where} line {pair['line']}"
    length = int(clean["attention_mask"].sum())
    if length != int(corrupted["attention_mask"].sum()):
      raise ValueError(f"{at}: clean and corrupted tokenise to {length} and "
                       f"{int(corrupted['attention_mask'].sum())} tokens; patching aligns "
                       "positions, so a pair must have equal token lengths")
    masks = [np.flatnonzero(e["input_ids"][:length] == tokenizer.mask_id)
             for e in (clean, corrupted)]
    if len(masks[0]) != 1 or len(masks[1]) != 1 or masks[0][0] != masks[1][0]:
      raise ValueError(f"{at}: clean and corrupted need one [MASK] each, at the same position")
    targets = [_one_piece(tokenizer, pair[k], at) for k in ("target_clean", "target_corrupted")]
    key = (pair.get("template", ""), length)
    rows.setdefault(key, []).append((clean, corrupted, int(masks[0][0]), targets, pair["line"]))
  return sorted((_group(tokenizer, key, members) for key, members in rows.items()),
                key=lambda g: -len(g.lines))


def _one_piece(tokenizer, word: str, at: str) -> int:
  """The one token id of `word` (a candidate at the mask)."""
  pieces = tokenizer.hf.encode(word, add_special_tokens=False).ids
  if len(pieces) != 1:
    raise ValueError(f"{at}: target {word!r} is {len(pieces)} word pieces; the logit "
                     "difference needs one token per candidate")
  return int(pieces[0])


def _group(tokenizer, key, members) -> PairGroup:
  template, length = key
  stack = lambda i, field: np.stack([m[i][field][:length] for m in members])
  tokens = [tokenizer.hf.id_to_token(int(t)) for t in members[0][0]["input_ids"][:length]]
  return PairGroup(f"{template + ', ' if template else ''}{length} tokens",
                   stack(0, "input_ids"), stack(1, "input_ids"), stack(0, "attention_mask"),
                   stack(0, "token_type_ids"), np.array([m[2] for m in members]),
                   np.array([m[3][0] for m in members]), np.array([m[3][1] for m in members]),
                   tokens, [m[4] for m in members])


# --- runs -----------------------------------------------------------------------------------
def _inputs(group: PairGroup, ids_PxL: np.ndarray, rows) -> dict:
  return {"input_ids": ids_PxL[rows], "attention_mask": group.attention_mask_PxL[rows],
          "token_type_ids": group.token_type_ids_PxL[rows]}


def _logit_diff(cfg, params, inputs, index_B, a_B, b_B, interventions=None, **options):
  """(logit(a) - logit(b) at each row's mask, the EncoderOutput)."""
  logits_Bx1xV, out = objectives.mlm_logits(cfg, params, inputs, index_B[:, None],
                                            interventions, **options)
  pick = lambda t_B: jnp.take_along_axis(logits_Bx1xV[:, 0], t_B[:, None], 1)[:, 0]
  return pick(a_B) - pick(b_B), out


@functools.partial(jax.jit, static_argnums=0)
def _clean_run(cfg, params, inputs, index_B, a_B, b_B):
  """(LD [B], block outputs [N, B, L, D], head outputs [N, B, L, H, K]) of a clean run;
  block n's output is hidden_states[n + 1], where interventions patch layer n."""
  ld_B, out = _logit_diff(cfg, params, inputs, index_B, a_B, b_B, output_hidden_states=True,
                          output_head_outputs=True)
  return ld_B, jnp.stack(out.hidden_states[1:]), jnp.stack(out.head_outputs)


@functools.partial(jax.jit, static_argnums=0)
def _patched_run(cfg, params, inputs, index_B, a_B, b_B, interventions):
  return _logit_diff(cfg, params, inputs, index_B, a_B, b_B, interventions)[0]


def _run_args(group: PairGroup, rows, ids_PxL):
  return (_inputs(group, ids_PxL, rows), group.mask_index_P[rows], group.target_clean_P[rows],
          group.target_corrupted_P[rows])


def clean_and_corrupt(cfg: EncoderConfig, params, group: PairGroup):
  """(LD_clean [P], LD_corrupt [P], clean block outputs [N, P, L, D], clean head outputs
  [N, P, L, H, K])."""
  rows = np.arange(len(group.lines))
  ld_clean, layers, heads = _clean_run(cfg, params, *_run_args(group, rows, group.clean_PxL))
  ld_corrupt = _patched_run(cfg, params, *_run_args(group, rows, group.corrupted_PxL), None)
  return np.asarray(ld_clean), np.asarray(ld_corrupt), layers, heads


def patched_logit_diff(cfg: EncoderConfig, params, group: PairGroup, where_NxPxL,
                       layers_NxPxLxD) -> np.ndarray:
  """LD [P] of the corrupted runs with the clean block outputs patched in where
  `where_NxPxL` is 1 (one run per pair, any pattern)."""
  rows = np.arange(len(group.lines))
  patch = Interventions.patch_layers(jnp.asarray(where_NxPxL, jnp.float32), layers_NxPxLxD)
  return np.asarray(_patched_run(cfg, params, *_run_args(group, rows, group.corrupted_PxL),
                                 patch))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _sweep(cfg, kind: str, params, inputs, index_c, a_c, b_c, clean_NxcxLx, layer):
  """LD [c, S] of c corrupted pairs, each run S times with one slot patched at `layer`:
  kind "position" (S = L positions, block outputs) or "head" (S = H heads, all positions)."""
  num_layers, c, length = clean_NxcxLx.shape[:3]
  slots = length if kind == "position" else cfg.num_heads
  rep = lambda x: jnp.repeat(x, slots, axis=0)
  slot_B = jnp.tile(jnp.arange(slots), c)
  at_layer_Nx1x1 = (jnp.arange(num_layers) == layer)[:, None, None]
  value = jnp.repeat(clean_NxcxLx, slots, axis=1)
  slot_1xBx1 = slot_B[None, :, None]
  if kind == "position":
    where_NxBxL = at_layer_Nx1x1 & (jnp.arange(length)[None, None] == slot_1xBx1)
    patch = Interventions.patch_layers(where_NxBxL.astype(jnp.float32), value)
  else:
    where_NxBxH = at_layer_Nx1x1 & (jnp.arange(slots)[None, None] == slot_1xBx1)
    where_NxBxLxH = jnp.broadcast_to(where_NxBxH[:, :, None, :],
                                     (num_layers, len(slot_B), length, slots))
    patch = Interventions.patch_heads(where_NxBxLxH.astype(jnp.float32), value)
  ld_B = _patched_run(cfg, params, jax.tree.map(rep, inputs), rep(index_c), rep(a_c), rep(b_c),
                      patch)
  return ld_B.reshape(c, slots)


def sweep(cfg: EncoderConfig, params, group: PairGroup, clean_NxPxLx, kind: str, *,
          chunk_rows: int = CHUNK_ROWS, bar=None) -> np.ndarray:
  """Summed LD over the group's pairs [N, S] with one layer x slot patched at a time
  (`_sweep`); pairs go `chunk_rows // S` at a time (the last chunk padded, not counted)."""
  pairs, length = group.corrupted_PxL.shape
  slots = length if kind == "position" else cfg.num_heads
  c = max(1, min(pairs, chunk_rows // slots))
  total_NxS = np.zeros((cfg.num_layers, slots))
  for start in range(0, pairs, c):
    rows = np.minimum(np.arange(start, start + c), pairs - 1)
    valid = np.arange(start, start + c) < pairs
    args = _run_args(group, rows, group.corrupted_PxL)
    clean = jnp.asarray(clean_NxPxLx)[:, rows]
    for layer in range(cfg.num_layers):
      ld_cxS = np.asarray(_sweep(cfg, kind, params, *args, clean, layer))
      total_NxS[layer] += ld_cxS[valid].sum(0)
    if bar is not None:
      bar.update(1)
  return total_NxS


# --- the study ------------------------------------------------------------------------------
def recovered(patched, clean: float, corrupt: float):
  """(patched - corrupt) / (clean - corrupt): 0 = the corrupted LD, 1 = the clean one."""
  gap = clean - corrupt
  return (np.asarray(patched) - corrupt) / gap if gap else np.full(np.shape(patched), np.nan)


def run(cfg: EncoderConfig, params, tokenizer, path, *, progress: bool = True) -> dict:
  """The report's `patching` section: `layer_position` [N][L] (the largest group's, its
  `positions` the token labels), `layer_head` [N][H] (all pairs), each group's own
  `layer_position`, and the mean clean / corrupted logit differences."""
  if objectives.head_of(params) != objectives.MLM_HEAD:
    raise ValueError("--patch needs a model with an MLM head (a masked-LM run, or a Hugging "
                     "Face *ForMaskedLM directory): the metric is a logit difference at [MASK]")
  groups = group_pairs(tokenizer, read_pairs(path))
  heads_NxH, sums, out_groups = 0.0, np.zeros(4), []
  chunks = sum(-(-len(g.lines) // max(1, CHUNK_ROWS // s)) for g in groups
               for s in (g.clean_PxL.shape[1], cfg.num_heads))
  with progress_lib.bar(chunks, f"patching {sum(len(g.lines) for g in groups)} pairs",
                        unit="chunk", every=1, enabled=progress) as bar:
    for group in groups:
      ld_clean, ld_corrupt, layers, heads = clean_and_corrupt(cfg, params, group)
      count = len(group.lines)
      positions_NxL = sweep(cfg, params, group, layers, "position", bar=bar) / count
      heads_NxH = heads_NxH + sweep(cfg, params, group, heads, "head", bar=bar)
      sums += [count, ld_clean.sum(), ld_corrupt.sum(), (ld_clean > 0).sum()]
      out_groups.append({"name": group.name, "pairs": count, "positions": group.tokens,
                         "ld_clean": float(ld_clean.mean()),
                         "ld_corrupt": float(ld_corrupt.mean()),
                         "layer_position": recovered(positions_NxL, ld_clean.mean(),
                                                     ld_corrupt.mean()).tolist()})
  count, clean, corrupt = sums[0], sums[1] / sums[0], sums[2] / sums[0]
  return {"source": str(path), "pairs": int(count), "metric": METRIC,
          "ld_clean": clean, "ld_corrupt": corrupt, "clean_correct": sums[3] / count,
          "layer_position": out_groups[0]["layer_position"],
          "positions": out_groups[0]["positions"], "layer_position_group": out_groups[0]["name"],
          "layer_head": recovered(heads_NxH / count, clean, corrupt).tolist(),
          "groups": out_groups, "layer_convention": LAYER_CONVENTION}


METRIC = ("recovered fraction of the mean logit difference logit(target_clean) - "
          "logit(target_corrupted) at [MASK]: (patched - corrupt) / (clean - corrupt)")
LAYER_CONVENTION = ("row n is block n + 1's output (layer n + 1; the embeddings are not "
                    "patched); layer_head: head h's output at every position")


def summary(result: dict) -> str:
  """Plain text: the mean logit differences, then the layer x position table (tokens as
  column heads) and each layer's most recovering head."""
  width = max(6, *(len(t) for t in result["positions"]))
  gap = result["ld_clean"] - result["ld_corrupt"]
  lines = [f"activation patching ({result['pairs']} pairs): mean LD clean "
           f"{result['ld_clean']:+.4f}, corrupted {result['ld_corrupt']:+.4f} (gap {gap:+.4f}, "
           f"what patching recovers); clean pairs preferring their target "
           f"{result['clean_correct']:.0%}",
           f"recovered fraction, layer x position ({result['layer_position_group']}):",
           "layer  " + " ".join(f"{t:>{width}}" for t in result["positions"])]
  fmt = lambda v: f"{v:>{width}.2f}" if v is not None and np.isfinite(v) else f"{'-':>{width}}"
  for n, row in enumerate(result["layer_position"]):
    lines.append(f"{n + 1:5d}  " + " ".join(fmt(v) for v in row))
  for n, row in enumerate(result["layer_head"]):
    best = int(np.nanargmax(row)) if np.isfinite(row).any() else 0
    lines.append(f"layer {n + 1}: head {best} recovers {fmt(row[best]).strip()} "
                 "(patched at every position)")
  return "\n".join(lines)


def plot(result: dict, path, *, context: str = ""):
  """Heat maps of the recovered fraction: layer x position (token labels) and layer x head."""
  position_NxL = np.array(result["layer_position"], float)
  head_NxH = np.array(result["layer_head"], float)
  n, length = position_NxL.shape
  fig, (left, right) = probe_report.subplots(
      1, 2, figsize=(0.55 * (length + head_NxH.shape[1]) + 4, 0.5 * n + 2.5))
  for ax, values, labels, what in ((left, position_NxL, result["positions"], "position"),
                                   (right, head_NxH, range(head_NxH.shape[1]), "head")):
    image = ax.imshow(values, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    for i, j in np.ndindex(values.shape):
      ax.text(j, i, f"{values[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(values.shape[1]), [str(t) for t in labels], rotation=90, fontsize=7)
    ax.set(xlabel=what, yticks=range(n), yticklabels=[str(i + 1) for i in range(n)],
           ylabel="layer (block i's output)")
  fig.colorbar(image, ax=right)
  title = ("activation patching: recovered fraction of the logit difference "
           f"({result['pairs']} pairs)")
  fig.suptitle(f"{title}\n{context}" if context else title, fontsize=9)
  return probe_report.save_figure(fig, path)
