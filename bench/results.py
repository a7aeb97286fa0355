"""Re-measures every config's documented result and flags the ones that drifted.

  python bench/results.py                                  # every config with a RESULT
  python bench/results.py time_series vit_fashion_mnist --seeds 3 --data-dir data

Each config states its result once, machine-readable, next to the docstring that gives its
command: a module-level `RESULT = dict(metric=..., values=(...), spread=...)` in
configs/NAME.py (`values`: the documented score of seeds 0, 1, ...; their mean is the
documented value). A config whose full run is too long for a 2-core machine adds
`overrides=("num_train_steps=20", ...)`: its documented result is of that shortened run,
and its docstring says so. This runs the docstring's `python train.py --config
configs/NAME.py --workdir W ...` command (the `--config.*` flags written on it, then the
overrides, then `--config.seed=S`), each seed in a fresh temporary workdir, reads the
metric from the run's metrics.jsonl and writes the markdown table the docs include
(docs/results_table.md, rows of the configs run: run them all, or together, for the
page). It exits 1, with one line per config, when a measured mean left
the documented mean by more than the config's spread.

Metric names are those of train.py's final log line: `test_X` is X of the `test` row (the
data.test_split score of the checkpoint best on eval), any other X the last `eval` row's X.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "results_table.md"


@dataclasses.dataclass(frozen=True)
class Declared:
  """A config's documented result: `values[s]` is seed s's score of `metric`; a measured
  mean further than `spread` from the documented one is flagged."""
  name: str
  metric: str
  values: tuple[float, ...]
  spread: float
  overrides: tuple[str, ...] = ()

  def documented(self, seeds: int) -> tuple[float, float, float]:
    """(mean, low, high) of the documented seeds `0 .. seeds-1` (all of them when fewer
    are documented): the reference a run over `seeds` seeds is held to."""
    values = self.values[:seeds] if seeds <= len(self.values) else self.values
    return statistics.fmean(values), min(values), max(values)


@dataclasses.dataclass(frozen=True)
class Measured:
  declared: Declared
  values: tuple[float, ...]
  wall_s: tuple[float, ...]

  @property
  def mean(self) -> float:
    return statistics.fmean(self.values)

  @property
  def drift(self) -> float:
    """Measured mean minus the documented mean of the same seeds."""
    return self.mean - self.declared.documented(len(self.values))[0]

  @property
  def ok(self) -> bool:
    return abs(self.drift) <= self.declared.spread + 1e-9


def docstring_command(name: str, text: str) -> list[str]:
  """The `--config.K=V` flags of the docstring's `python train.py --config configs/NAME.py
  --workdir W` command (continuation lines joined); raises ValueError without one."""
  doc = ast.get_docstring(ast.parse(text)) or ""
  joined = re.sub(r"\\\s*\n\s*", " ", doc)
  found = re.search(rf"python train\.py --config configs/{re.escape(name)}\.py --workdir \S+(.*)",
                    joined)
  if not found:
    raise ValueError(f"configs/{name}.py: the docstring gives no `python train.py --config "
                     f"configs/{name}.py --workdir W` command")
  words = shlex.split(found.group(1).split("#")[0])
  return [w for w in words if w.startswith("--config.")]


def declared_result(name: str, text: str) -> Declared | None:
  """configs/NAME.py's module-level `RESULT = dict(...)` (read with ast, nothing imported);
  None when the config declares none."""
  for node in ast.parse(text).body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["RESULT"]:
      value = _dict_literal(node.value) if isinstance(node.value, ast.Call) else node.value
      fields = ast.literal_eval(value)
      return Declared(name=name, metric=fields["metric"], values=tuple(fields["values"]),
                      spread=float(fields["spread"]), overrides=tuple(fields.get("overrides", ())))
  return None


def unscored_reason(text: str) -> str | None:
  """configs/NAME.py's module-level `UNSCORED = "why"`: a config whose command needs what a
  2-core machine has not (a bucket, an accelerator); its numbers live where the string says."""
  for node in ast.parse(text).body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["UNSCORED"]:
      return str(ast.literal_eval(node.value))
  return None


def _dict_literal(call: ast.Call) -> ast.Dict:
  """`dict(a=1, b=2)` as the literal `{"a": 1, "b": 2}` (literal_eval reads no calls)."""
  return ast.Dict(keys=[ast.Constant(k.arg) for k in call.keywords],
                  values=[k.value for k in call.keywords])


def read_metric(rows: list[dict], metric: str) -> float:
  """`metric` of a run's metrics.jsonl rows: `test_X` from the test row, X from the last
  eval row; raises KeyError naming what is there when the run logged no such metric."""
  split, key = ("test", metric[len("test_"):]) if metric.startswith("test_") else ("eval", metric)
  found = [r for r in rows if r.get("split") == split and key in r]
  if not found:
    seen = sorted({f"{r['split']}:{k}" for r in rows if r.get("split") in ("eval", "test")
                   for k in r if k not in ("step", "split", "time")})
    raise KeyError(f"no {metric!r} in metrics.jsonl ({split} rows with {key!r}); logged: {seen}")
  return float(max(found, key=lambda r: r["step"])[key])


def run_once(declared: Declared, seed: int, extra: list[str]) -> tuple[float, float]:
  """(metric, wall seconds) of the docstring command with `seed`, in a fresh workdir."""
  path = REPO / "configs" / f"{declared.name}.py"
  flags = docstring_command(declared.name, path.read_text(encoding="utf-8"))
  flags += [f"--config.{o}" for o in declared.overrides]
  flags += [f"--config.seed={seed}", "--config.progress_bar=false", *extra]
  with tempfile.TemporaryDirectory(prefix=f"results_{declared.name}_") as workdir:
    command = [sys.executable, "train.py", "--config", f"configs/{declared.name}.py",
               "--workdir", workdir, *flags]
    print("$", shlex.join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=_plain_env())
    wall = time.perf_counter() - started
    if done.returncode:
      raise RuntimeError(f"{declared.name} seed {seed} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()
            if line.strip()]
  return read_metric(rows, declared.metric), wall


def _plain_env() -> dict[str, str]:
  """This environment less XLA_FLAGS: a forced host device count (the tests' 8) changes
  how a run splits its batches, so not the run its docstring documents."""
  return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def measure(declared: Declared, seeds: int, extra: list[str]) -> Measured:
  """Seeds 0 .. seeds-1 of one config, each printed (with the load) as it finishes."""
  runs = []
  for seed in range(seeds):
    value, wall = run_once(declared, seed, extra)
    runs.append((value, wall))
    print(f"{declared.name} seed {seed}: {declared.metric} {value:.4f}, {wall:.0f} s, load "
          f"average {os.getloadavg()[1]:.1f} (5 min)", flush=True)
  return Measured(declared, tuple(v for v, _ in runs), tuple(w for _, w in runs))


def _span(mean: float, low: float, high: float, n: int) -> str:
  return f"{mean:.4f}" if n == 1 else f"{mean:.4f} ({low:.4f}-{high:.4f}, {n} seeds)"


def table(results: list[Measured], note: str, when: str = "") -> str:
  """The markdown table: config, metric, documented, measured, spread, verdict, wall time
  and `when` (the date and load it was measured at)."""
  lines = [HEADER, "|---|---|---|---|---|---|---|---|"]
  for m in results:
    n = len(m.values)
    documented = _span(*m.declared.documented(n), min(n, len(m.declared.values)))
    measured = _span(m.mean, min(m.values), max(m.values), n)
    verdict = "ok" if m.ok else f"**drifted** ({m.drift:+.4f})"
    wall = f"{statistics.fmean(m.wall_s) / 60:.1f} min"
    shortened = "".join(f" `--config.{o}`" for o in m.declared.overrides)
    lines.append(f"| `{m.declared.name}.py`{shortened} | {m.declared.metric} | {documented} | "
                 f"{measured} | ±{m.declared.spread:g} | {verdict} | {wall} | {when} |")
  return "\n".join(lines) + f"\n\n{note}\n"


HEADER = "| config | metric | documented | measured | spread | verdict | wall time / seed | measured on |"


def merged(old: str, new: str, *, keep_note: bool = False) -> str:
  """`new`'s table with the rows of `old` for configs `new` did not run (a subset run
  updates its rows and keeps the others, each with its own date), sorted by config;
  `keep_note` (a subset run, which did not read every config): `old`'s note under it."""
  def rows(text):
    return {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}
  kept = {**{k: v for k, v in rows(old).items() if v.count("|") == HEADER.count("|")},
          **rows(new)}
  head, _, tail = new.partition("\n\n")
  if keep_note and "\n\n" in old:
    tail = old.partition("\n\n")[2]
  return "\n".join([*head.splitlines()[:2], *(kept[k] for k in sorted(kept))]) + "\n\n" + tail


def flags(results: list[Measured]) -> list[str]:
  """One line per config whose measured mean left its documented value by more than its
  spread."""
  return [f"{m.declared.name}: {m.declared.metric} {m.mean:.4f} left the documented "
          f"{m.declared.documented(len(m.values))[0]:.4f} by {m.drift:+.4f} "
          f"(spread ±{m.declared.spread:g})" for m in results if not m.ok]


def declared_configs(names: list[str]) -> tuple[list[Declared], list[str]]:
  """(the RESULT of each named config, []); with no names, (every config's that declares
  one, "NAME (why)" of those that declare UNSCORED instead). A config that declares
  neither is refused: every config states its result or why it has none here."""
  paths = ([REPO / "configs" / f"{n}.py" for n in names] if names
           else sorted((REPO / "configs").glob("*.py")))
  found, unscored = [], []
  for path in paths:
    if not path.is_file():
      raise SystemExit(f"bench/results.py: no config {path.relative_to(REPO)}")
    text = path.read_text(encoding="utf-8")
    declared, why = declared_result(path.stem, text), unscored_reason(text)
    if declared is not None:
      found.append(declared)
    elif why is not None and not names:
      unscored.append(f"{path.stem} ({why})")
    else:
      raise SystemExit(f"bench/results.py: configs/{path.stem}.py declares no RESULT"
                       + (f": it is not scored here, {why}" if why else
                          " (add RESULT = dict(metric=..., values=(...), spread=...), or "
                          "UNSCORED = 'why' for a config a 2-core machine cannot run)"))
  return found, unscored


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("configs", nargs="*", help="config names (default: every one with a RESULT)")
  parser.add_argument("--seeds", type=int, default=0,
                      help="seeds per config (default: as many as its RESULT documents)")
  parser.add_argument("--data-dir", default="", help="passed as --config.data.data_dir")
  parser.add_argument("--out", default=str(TABLE), help="markdown table written here")
  args = parser.parse_args()
  extra = [f"--config.data.data_dir={args.data_dir}"] if args.data_dir else []
  declared, unscored = declared_configs(args.configs)
  results = [measure(d, args.seeds or len(d.values), extra) for d in declared]
  when = f"{datetime.date.today()}, load {os.getloadavg()[1]:.1f}"
  note = (f"Each row: `python bench/results.py NAME` on {os.cpu_count()} CPU cores, on the "
          "date given, with the 5-minute load average at the end of its run (wall times on a "
          "shared machine are upper bounds).")
  if unscored:
    note += f" Not scored here: {'; '.join(unscored)}."
  out = pathlib.Path(args.out)
  text = merged(out.read_text(encoding="utf-8") if out.is_file() else "",
                table(results, note, when), keep_note=bool(args.configs))
  out.write_text(text, encoding="utf-8")
  print(text)
  drifted = flags(results)
  for line in drifted:
    print("DRIFTED", line)
  sys.exit(1 if drifted else 0)


if __name__ == "__main__":
  main()
