"""Executes the colab/ notebooks top to bottom with nbclient; fails on any cell error.

  python tools/run_notebooks.py                          # every colab/*.ipynb
  python tools/run_notebooks.py colab/03_probing.ipynb --save runs/notebooks

Each notebook runs in a fresh kernel (this interpreter's, so the venv's packages) with the
repository root as the working directory, and its wall time is printed. Outputs are never
written back to colab/: the committed notebooks stay stripped (`--save DIR` writes executed
copies elsewhere, e.g. to look at the plots).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[1]


def execute(path: pathlib.Path, timeout: int, save: pathlib.Path | None) -> float:
  """Runs one notebook from the repo root; its wall time. Raises on a cell error."""
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                   resources={"metadata": {"path": str(REPO)}})
  started = time.perf_counter()
  try:
    client.execute()
  finally:
    if save is not None:
      save.mkdir(parents=True, exist_ok=True)
      nbformat.write(nb, save / path.name)
  return time.perf_counter() - started


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("notebooks", nargs="*", type=pathlib.Path,
                      help="default: colab/*.ipynb")
  parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
  parser.add_argument("--save", type=pathlib.Path, help="write executed copies here")
  args = parser.parse_args(argv)
  paths = [p.resolve() for p in args.notebooks] or sorted((REPO / "colab").glob("*.ipynb"))
  failed = []
  for path in paths:
    print(f"{path.name}: running", flush=True)
    try:
      seconds = execute(path, args.timeout, args.save)
    except (nbclient.exceptions.CellExecutionError, nbclient.exceptions.CellTimeoutError,
            nbclient.exceptions.DeadKernelError) as error:
      print(f"{path.name}: FAILED\n{error}", flush=True)
      failed.append(path.name)
      continue
    print(f"{path.name}: ok in {seconds:.0f} s", flush=True)
  if failed:
    print(f"failed: {', '.join(failed)}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
