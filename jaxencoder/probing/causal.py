"""The causal studies a probing study adds (`jaxencoder-probe --amnesic`, `--patch PAIRS`):
whether the model uses what the probes decode (amnesic.py) and where it uses the
difference between minimal pairs (patching.py). Both need the whole model's params with
its head (`load.load_checkpoint(..., with_head=True)`), checked before any work
(`check_model`)."""

from __future__ import annotations

from jaxencoder.probing import amnesic, objectives, patching


def check_model(params, *, amnesic_study: bool, patch: str | None, source: str) -> None:
  """A ValueError naming what the flags need and what `source` has, before any work."""
  head = objectives.head_of(params)
  has = {objectives.MLM_HEAD: "an MLM head", objectives.CLASSIFIER_HEAD: "a classifier head",
         None: "neither (an encoder without a head, e.g. a BertModel)"}[head]
  if amnesic_study and head is None:
    raise ValueError(f"--amnesic {objectives.NEEDS_HEAD}; {source} has {has}")
  if patch and head != objectives.MLM_HEAD:
    raise ValueError("--patch needs a model with an MLM head (a masked-LM run, or a Hugging "
                     f"Face *ForMaskedLM directory): the metric is a logit difference at "
                     f"[MASK]; {source} has {has}")


def run(cfg, model_params, tokenizer, dataset, feats, rep: dict, options) -> dict:
  """{"amnesic": ..., "patching": ...} as `options` (study.StudyOptions) ask."""
  if dataset.level == "image":
    raise ValueError("--amnesic and --patch need text data and a text model")
  out = {}
  if options.amnesic:
    settings = amnesic.AmnesicOptions(sentences=options.amnesic_sentences,
                                      seed=options.probe.seed, batch_size=options.batch_size,
                                      max_length=options.max_length)
    _, sentences = amnesic.held_out(feats, options.probe, settings.sentences)
    objective = amnesic.objective_for(cfg, model_params, tokenizer, dataset, feats, sentences,
                                      settings, source=rep.get("source") or "the model",
                                      class_names=options.class_names)
    linear = rep["probes"].get("linear")
    out["amnesic"] = amnesic.run(
        cfg, feats, objective, options.probe, seed=options.probe.seed,
        probe_before=[r["accuracy"] for r in linear["layers"]] if linear else None,
        progress=options.progress)
    out["amnesic"]["sentences"] = int(len(sentences))  # test-split sentences scored
    if isinstance(objective, objectives.MlmObjective):
      out["amnesic"]["masked_tokens"] = objective.tokens
  if options.patch:
    out["patching"] = patching.run(cfg, model_params, tokenizer, options.patch,
                                   progress=options.progress)
  return out


def plots(rep: dict, out_dir, context: str) -> list:
  """amnesic.png and patching.png, for the studies the report holds."""
  paths = []
  if rep.get("amnesic"):
    paths.append(amnesic.plot(rep["amnesic"], out_dir / "amnesic.png", context=context))
  if rep.get("patching"):
    paths.append(patching.plot(rep["patching"], out_dir / "patching.png", context=context))
  return paths


def summaries(rep: dict) -> list[str]:
  """The causal studies' tables, for the study's summary."""
  return ([amnesic.summary(rep["amnesic"])] if rep.get("amnesic") else []) + (
      [patching.summary(rep["patching"])] if rep.get("patching") else [])
