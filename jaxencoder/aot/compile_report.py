"""The compile report for one config and target: a JSON-able dict, and its table."""

from __future__ import annotations

import logging
import textwrap
import time

import jax

from jaxencoder.model import flash
from jaxencoder.aot import compiled as compiled_lib
from jaxencoder.aot import hlo
from jaxencoder.aot.targets import GIB, Target, target_devices

log = logging.getLogger("jaxencoder")


def _step_dict(report: compiled_lib.StepReport, hbm_bytes: float, num_chips: int,
               num_layers: int) -> dict:
  out = {"compiled": report.compiled, "batch_size": report.batch_size,
         "compile_seconds": round(report.compile_seconds, 2),
         "fits": compiled_lib.fits(report, hbm_bytes), "error": report.error,
         "out_of_memory": report.oom, "memory_per_chip": report.memory}
  if report.compiled:
    out.update(flops=report.flops, flops_per_chip=report.flops / num_chips,
               collectives=report.collectives, kernels=report.kernels,
               attention=step_attention(report, num_layers))
    if report.unknown_trip_counts:
      out["loops_counted_once"] = report.unknown_trip_counts
  return out


def step_attention(report: compiled_lib.StepReport, num_layers: int) -> dict:
  """Which attention one compiled step's layers run: layers on a kernel counted from the
  kernel calls in its HLO (a forward call per layer in the eval step; a backward (dq)
  call per layer in the train step, whose forward calls remat may repeat), and for each
  layer that runs xla, why (from the plans made while tracing it), naming the key to
  change."""
  kernels, backward = report.kernels, report.name == "train"
  splash = hlo.splash_calls(kernels)
  cudnn = {k: v for k, v in kernels.items() if k.startswith("__cudnn$fmha")}
  impl, layers, calls = "xla", 0, {}
  if splash:
    impl, calls = "splash", splash
    layers = splash.get("dq" if backward else "fwd", 0)
  elif cudnn:
    impl, calls = "cudnn", cudnn
    layers = sum(v for k, v in cudnn.items() if ("Backward" in k) == backward)
  fallbacks = [{"layers": flash.layer_ranges(where), "kernel": kernel, "reason": why}
               for plans in report.plans
               for (kernel, why), where in flash.fallbacks(plans).items()]
  return {"impl": impl, "layers_on_kernel": layers, "num_layers": num_layers,
          "kernel_calls": calls, "fallbacks": fallbacks}


def attention_summary(cfg, steps: dict) -> dict:
  """The whole run's attention line: the train step's (where dropout or remat may keep a
  kernel out), else the eval step's."""
  for name in ("train", "eval"):
    step = steps.get(name)
    if step and step["compiled"]:
      return {**step["attention"], "counted_in": f"{name} step"}
  return {"impl": "unknown", "layers_on_kernel": 0, "num_layers": cfg.num_layers}


def compile_config(config, target: Target, *, steps=("train", "eval"), max_batch: bool = False,
                   group: int | None = None) -> dict:
  """Compiles the config's steps for the target; the report as a dict."""
  started = time.perf_counter()
  devices = target_devices(target)
  # A compile-only client cannot load executables: the persistent cache would only warn.
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    return _compile_config(config, target, devices, steps, max_batch, group, started)
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)


def _compile_config(config, target, devices, steps, max_batch, group, started) -> dict:
  built = compiled_lib.build(config, devices, group=group)
  hbm, chips = target.chip.hbm_bytes, target.num_chips
  reports = {}
  for name in steps:
    batch = config.batch_size if name == "train" else config.eval_batch_size
    log.info("compiling the %s step for %s (batch %d)...", name, target.name, batch)
    reports[name] = compiled_lib.compile_step(built, name, batch, group=group)
    log.info("%s the %s step for %s in %s", "compiled" if reports[name].compiled else
             "failed to compile", name, target.name, duration(reports[name].compile_seconds))
  mesh = dict(built.mesh.shape)
  result = {
      "topology": target.name,
      "target": {"chip": target.chip.name, "platform": target.chip.platform,
                 "chips": chips, "hosts": target.hosts, "slices": target.slices,
                 "topology_name": target.topology_name, "hbm_bytes_per_chip": hbm,
                 "device_kind": devices[0].device_kind},
      "mesh": mesh, "params": built.param_count, "seq_len": config.data.seq_len,
      "task": config.task, "dtype": config.model.dtype, "scan_layers": config.model.scan_layers,
      "remat_policy": config.model.remat_policy, "attention_impl": config.model.attention_impl,
      "state_bytes_per_chip": built.state_bytes_per_chip,
      "steps": {n: _step_dict(r, hbm, chips, config.model.num_layers)
                for n, r in reports.items()},
  }
  result["attention"] = attention_summary(config.model, result["steps"])
  result["fits"] = all(s["fits"] for s in result["steps"].values())
  train = reports.get("train")
  too_big = train is not None and not compiled_lib.fits(train, hbm) and (
      train.compiled or train.oom)
  if train is not None and (max_batch or too_big):  # a miss always says what would fit
    largest, tried = compiled_lib.largest_batch(built, hbm, reports["train"], group=group)
    result["max_batch"] = largest
    result["max_batch_per_chip"] = largest / chips
    result["max_batch_tried"] = [
        {"batch_size": r.batch_size, "fits": compiled_lib.fits(r, hbm),
         "total_bytes_per_chip": r.needed_bytes, "compiled": r.compiled} for r in tried]
  result["verdict"] = verdict(result)
  result["seconds"] = round(time.perf_counter() - started, 1)
  return result


def duration(seconds: float) -> str:
  """'2 min 31 s', '12.3 s'."""
  if seconds < 60:
    return f"{seconds:.1f} s"
  minutes, rest = divmod(int(round(seconds)), 60)
  return f"{minutes} min {rest} s"


def verdict(result: dict) -> str:
  """One line: fits, or `does not fit: X GiB per chip of Y GiB (chip); ...`."""
  hbm, chip = result["target"]["hbm_bytes_per_chip"], result["target"]["chip"]
  largest = result.get("max_batch")
  tail = "" if largest is None else f"; largest batch that fits: {largest or 'none'}"
  for name, step in result["steps"].items():
    if step["fits"]:
      continue
    needed = step["memory_per_chip"].get("total_bytes", 0.0)
    if step["compiled"] or step["out_of_memory"]:
      amount = f"{needed / GIB:.1f} GiB" if needed else "more"
      return (f"does not fit: {amount} per chip of {hbm / GIB:.4g} GiB ({chip}){tail} "
              f"({name} step at batch {step['batch_size']})")
    return f"does not compile: {name} step: {step['error']}"
  return f"fits: {_peak(result) / GIB:.2f} GiB per chip of {hbm / GIB:.4g} GiB ({chip}){tail}"


def _peak(result: dict) -> float:
  return max(s["memory_per_chip"].get("total_bytes", 0.0) for s in result["steps"].values())


def _gib(n: float) -> str:
  return f"{n / GIB:.2f} GiB" if n >= GIB / 4 else f"{n / (1 << 20):.1f} MiB"


def _count_bytes(c: dict) -> str:
  return "-" if not c["count"] else f"{c['count']:g} x, {_gib(c['bytes'])}"


def _one(layers: str) -> bool:
  return layers.isdigit()


def _layers(layers: str) -> str:
  """'layer 21 runs' / 'layers 0-20 run'."""
  return f"layer {layers} runs" if _one(layers) else f"layers {layers} run"


def attention_lines(result: dict) -> list[str]:
  """One line per compiled step: its kernel and layers on it; then why each other layer
  runs xla, naming the config key to change."""
  lines = []
  for name, step in result["steps"].items():
    if not step["compiled"]:
      continue
    a = step["attention"]
    lines.append(f"attention, {name} step: {a['impl']} in {a['layers_on_kernel']} of "
                 f"{a['num_layers']} layers (kernel calls in the compiled program; "
                 f"attention_impl={result['attention_impl']})")
    lines += [f"  {_layers(f['layers'])} xla: {f['kernel']} cannot serve "
              f"{'it' if _one(f['layers']) else 'them'} ({f['reason']})" for f in a["fallbacks"]]
  return lines


def format_report(result: dict) -> str:
  """The report as a table: one column per step."""
  t, steps = result["target"], result["steps"]
  names = list(steps)
  mesh = " ".join(f"{k}={v}" for k, v in result["mesh"].items())
  lines = [f"{result.get('config', '')} on {result['topology']}: {t['chips']} x {t['device_kind']}"
           f" ({t['topology_name']}, {t['hosts']} host{'s' * (t['hosts'] != 1)}), "
           f"{t['hbm_bytes_per_chip'] / GIB:.4g} GiB HBM per chip",
           f"model: {result['params'] / 1e6:.1f}M params, task {result['task']}, "
           f"{result['dtype']}, scan={result['scan_layers']}, remat={result['remat_policy']}; "
           f"mesh {mesh}; L={result['seq_len']}"]
  rows = [("", [f"{n} step" for n in names])]
  def row(label, fn):
    rows.append((label, [fn(steps[n]) for n in names]))
  row("global batch", lambda s: f"{s['batch_size']} ({s['batch_size'] / t['chips']:g} per chip)")
  row("compiled", lambda s: f"yes, {s['compile_seconds']:.1f} s" if s["compiled"] else
      ("no: out of memory" if s["out_of_memory"] else "no"))
  for key, label in (("argument_bytes", "arguments / chip"), ("output_bytes", "outputs / chip"),
                     ("alias_bytes", "  aliased (donated)"), ("temp_bytes", "temp / chip")):
    row(label, lambda s, k=key: _gib(s["memory_per_chip"][k]) if k in s["memory_per_chip"] else "-")
  row("total / chip", lambda s: _gib(s["memory_per_chip"].get("total_bytes", 0.0)) +
      ("" if s["compiled"] else " (at least)"))
  row("fits", lambda s: "yes" if s["fits"] else "NO")
  row("matmul FLOPs / step", lambda s: f"{s['flops'] / 1e12:.3g} T ({s['flops_per_chip'] / 1e12:.3g} T"
      " per chip)" if s["compiled"] else "-")
  for kind in hlo.COLLECTIVES:
    row(kind, lambda s, k=kind: _count_bytes(s["collectives"][k]) if s["compiled"] else "-")
  row("kernels", lambda s: ", ".join(f"{k} {v}" for k, v in sorted(s["kernels"].items()))
      or "none" if s["compiled"] else "-")
  lines = [*map(_wrapped, lines), *_table(rows, len(names))]
  lines += map(_wrapped, attention_lines(result))
  lines.append("collective bytes: per chip per step (the larger of operand and result); "
               "every value: --json")
  lines.append(_wrapped(result["verdict"] + f"  [{result['seconds']:.0f} s]"))
  return "\n".join(lines)


COLUMNS = 100  # the report's width


def _wrapped(line: str) -> str:
  """`line` in COLUMNS, its continuation lines indented."""
  return textwrap.fill(line, COLUMNS, subsequent_indent="    ", break_on_hyphens=False)


def _table(rows: list[tuple[str, list[str]]], num_cols: int) -> list[str]:
  """Rows of label + cells in COLUMNS: a cell too wide for its share ends in '...'."""
  width = max(len(label) for label, _ in rows)
  share = (COLUMNS - width - 2) // num_cols - 2
  clip = lambda c: c if len(c) <= share else c[:share - 3] + "..."  # noqa: E731
  cells = [[clip(c) for c in row] for _, row in rows]
  cols = [max(len(r[i]) for r in cells) for i in range(num_cols)]
  return [(f"{label:<{width}}  " + "  ".join(f"{c:<{w}}" for c, w in zip(row, cols))).rstrip()
          for (label, _), row in zip(rows, cells)]
