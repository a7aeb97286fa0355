"""Einsum -> MatMul in an ONNX graph: jax2onnx 0.17.1 writes a dense layer on [B, L, D]
(dot_general without batch dims, lhs of rank 3) as Einsum "abc,cd->abd", whose
onnxruntime CPU kernel ran all-MiniLM-L6-v2 (8 x 128) about 1.3x slower than MatMul
(bench/export_bench.py). Same values: a relabelling of one contraction, no other math.
"""

from __future__ import annotations

Perm = list[int] | None  # None: the identity


def matmul_plan(equation: str) -> tuple[Perm, Perm, Perm] | None:
  """(lhs, rhs, output) transpositions that make a two-operand einsum a MatMul, or None.

  Fits when one letter is contracted, the rhs has one free letter, and the lhs has one
  free letter (or several, and no batch letters: MatMul broadcasts the rhs matrix)."""
  if "..." in equation or equation.count("->") != 1:
    return None
  inputs, out = equation.split("->")
  if inputs.count(",") != 1:
    return None
  a, b = inputs.split(",")
  if any(len(set(x)) != len(x) for x in (a, b, out)):
    return None
  batch = [c for c in a if c in b and c in out]
  contracted = [c for c in a if c in b and c not in out]
  free_a, free_b = [c for c in a if c not in b], [c for c in b if c not in a]
  product = batch + free_a + free_b
  if (sorted(out) != sorted(product) or len(contracted) != 1 or len(free_b) != 1
      or not free_a or (batch and len(free_a) != 1)):
    return None
  perm = lambda src, dst: None if list(src) == dst else [src.index(c) for c in dst]
  return (perm(a, batch + free_a + contracted), perm(b, batch + contracted + free_b),
          perm(product, list(out)))


def einsums_to_matmul(model) -> int:
  """Rewrites, in the ONNX ModelProto `model` (in place), each Einsum that `matmul_plan`
  fits as [Transpose] + MatMul [+ Transpose]; returns how many."""
  import onnx  # lazy: optional extra export (onnx)
  nodes, count = [], 0
  for node in model.graph.node:
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    plan = node.op_type == "Einsum" and len(node.input) == 2 and matmul_plan(equation)
    if not plan:
      nodes.append(node)
      continue
    count += 1
    inputs = list(node.input)
    for i, perm in enumerate(plan[:2]):
      if perm:
        inputs[i] = f"{node.name}_T{i}"
        nodes.append(onnx.helper.make_node("Transpose", [node.input[i]], [inputs[i]],
                                           name=inputs[i], perm=perm))
    product = node.output[0] if plan[2] is None else f"{node.name}_product"
    nodes.append(onnx.helper.make_node("MatMul", inputs, [product], name=f"{node.name}_MatMul"))
    if plan[2]:
      nodes.append(onnx.helper.make_node("Transpose", [product], [node.output[0]],
                                         name=f"{node.name}_Tout", perm=plan[2]))
  del model.graph.node[:]
  model.graph.node.extend(nodes)
  return count
