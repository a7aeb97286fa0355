"""What a compiled program does per step, read from its optimized HLO text: collectives
(count and bytes) and custom kernels (e.g. the splash attention kernels), each counted as
often as it runs: an op inside a loop body counts once per iteration (a scanned stack of
N layers runs its body N times; the trip count is the one the HLO states, or the constant
its condition compares a counter from 0 against), inside a fusion or async computation
as often as that is called.
"""

from __future__ import annotations

import collections
import dataclasses
import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
               "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
               "c64": 8, "c128": 16}
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*->.*\{\s*$")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_ARRAY = re.compile(r"\b([a-z]+\d*[a-z\d]*)\[([\d,]*)\]")
_CALLED = re.compile(r"\b(calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


@dataclasses.dataclass(frozen=True)
class Op:
  name: str
  shape: str  # the result's shape text, e.g. bf16[128,768]{1,0} or a tuple
  opcode: str
  rest: str  # operands and attributes


@dataclasses.dataclass
class StepOps:
  """Per step: executed count and bytes per chip of each collective kind, and executed
  calls of each kernel (TPU Pallas kernels by name, cuDNN calls by target); XLA's own
  custom calls are not kernels."""
  collectives: dict[str, dict[str, float]]
  kernels: dict[str, int]
  unknown_trip_counts: int = 0  # loops whose trip count the HLO does not state: counted once


def _split_shape(text: str) -> tuple[str, str]:
  """(shape, remainder) of `SHAPE opcode(...)`: a balanced tuple or one token."""
  if text.startswith("("):
    depth = 0
    for i, ch in enumerate(text):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return text[:i + 1], text[i + 1:].lstrip()
  shape, _, rest = text.partition(" ")
  return shape, rest


def parse(hlo_text: str) -> tuple[dict[str, list[Op]], str]:
  """({computation: ops}, entry computation name) of an HLO module's text."""
  computations: dict[str, list[Op]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = computations.setdefault(header.group(1), [])
      entry = header.group(1) if line.startswith("ENTRY") else entry
      continue
    named = _NAME.match(line) if current is not None else None
    if not named:
      continue
    shape, rest = _split_shape(line[named.end():])
    opcode, _, rest = rest.partition("(")
    current.append(Op(named.group(1), shape, opcode.strip(), rest))
  return computations, entry


def shape_bytes(shape: str) -> float:
  """Bytes of every array in a shape text (a tuple's elements summed)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape.split("{")[0] if not shape.startswith("(") else shape):
    if dtype in DTYPE_BYTES:
      count = 1
      for d in filter(None, dims.split(",")):
        count *= int(d)
      total += DTYPE_BYTES[dtype] * count
  return total


def _loop_bound(condition: list[Op]) -> int | None:
  """N of a loop condition `counter < N` (or `<= N - 1`) against a constant: the trip
  count of a loop counting from 0, as scans and XLA's windowed matmuls do."""
  constants = {}
  for op in condition:
    value = re.match(r"(-?\d+)\)", op.rest) if op.opcode == "constant" else None
    if value:
      constants[op.name] = int(value.group(1))
  for op in reversed(condition):
    direction = re.search(r"direction=(LT|LE)", op.rest)
    if op.opcode == "compare" and direction:
      operands = re.findall(r"%([\w.\-]+)", op.rest.split(")", 1)[0])
      if len(operands) == 2 and operands[1] in constants:
        return constants[operands[1]] + (direction.group(1) == "LE")
  return None


def _callees(op: Op, computations: dict[str, list[Op]]) -> list[tuple[str, int | None]]:
  """(computation, times per call) that `op` runs; a while body its trip count (None:
  neither stated nor readable from its condition)."""
  found, trips = [], None
  if op.opcode == "while":
    stated = _TRIPS.search(op.rest)
    condition = re.search(r"condition=%?([\w.\-]+)", op.rest)
    trips = int(stated.group(1)) if stated else (
        _loop_bound(computations.get(condition.group(1), [])) if condition else None)
  for kind, name in _CALLED.findall(op.rest):
    times = 1
    if op.opcode == "while" and kind in ("body", "condition"):
      times = None if trips is None else trips + (kind == "condition")
    found.append((name, times))
  for group in _BRANCHES.findall(op.rest):
    found += [(name.strip().lstrip("%"), 1) for name in group.split(",") if name.strip()]
  return found


def executions(computations: dict[str, list[Op]], entry: str) -> tuple[dict[str, float], int]:
  """How many times each computation runs per call of `entry`; loops of unstated trip
  count run once (counted in the second value)."""
  runs: dict[str, float] = collections.defaultdict(float)
  unknown = 0
  order, seen = [], set()

  def visit(name: str) -> None:  # callers before callees (the call graph is a DAG)
    if name in seen or name not in computations:
      return
    seen.add(name)
    for op in computations[name]:
      for callee, _ in _callees(op, computations):
        visit(callee)
    order.append(name)

  visit(entry)
  runs[entry] = 1.0
  for name in reversed(order):
    for op in computations[name]:
      for callee, times in _callees(op, computations):
        if times is None:
          unknown += 1
          times = 1
        runs[callee] += runs[name] * times
  return runs, unknown


def step_ops(hlo_text: str) -> StepOps:
  """Collectives and kernels of one run of a compiled program (per chip: SPMD HLO)."""
  computations, entry = parse(hlo_text)
  runs, unknown = executions(computations, entry)
  shapes = {op.name: op.shape for ops in computations.values() for op in ops}
  collectives = {kind: {"count": 0, "bytes": 0.0} for kind in COLLECTIVES}
  kernels: dict[str, int] = collections.Counter()
  for name, ops in computations.items():
    times = runs.get(name, 0.0)
    if not times:
      continue
    for op in ops:
      kind = op.opcode.removesuffix("-start")
      if kind in collectives:
        operands = re.findall(r"%([\w.\-]+)", op.rest.split(")", 1)[0])
        moved = max([shape_bytes(op.shape)] + [shape_bytes(shapes.get(o, "")) for o in operands])
        if op.opcode.endswith("-start") and op.shape.startswith("("):
          moved = max(moved / 2, 1.0)  # an async start's tuple holds operand and result
        collectives[kind]["count"] += times
        collectives[kind]["bytes"] += times * moved
      elif op.opcode == "custom-call":
        target = _TARGET.search(op.rest)
        target = target.group(1) if target else "?"
        if target == "tpu_custom_call":
          kernels[re.sub(r"\.\d+$", "", op.name)] += int(times)  # a Pallas kernel, by name
        elif target.startswith("__cudnn"):  # cuDNN (attention) on GPU
          kernels[target] += int(times)
  return StepOps(collectives, dict(kernels), unknown)


def splash_calls(kernels: dict[str, int]) -> dict[str, int]:
  """The splash attention kernels among a step's kernels: {fwd | dq | dkv: calls}."""
  out: dict[str, int] = collections.Counter()
  for name, calls in kernels.items():
    match = re.match(r"splash_mha_(fwd|dq|dkv)", name)
    if match:
      out[match.group(1)] += calls
  return dict(out)
