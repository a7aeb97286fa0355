"""The package's layers: imports point one way, nothing imports a command-line module,
and `import jaxencoder` stays light."""

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import import_graph  # noqa: E402

# folder -> folders it must not import (a top-level module is a folder of its own;
# "package" is jaxencoder/__init__.py).
EVERY_FOLDER = {"model", "train", "data", "pretrained", "probing", "io", "tokenizer", "cli",
                "aot", "tasks", "progress", "export", "retrieval", "rank_correlation"}
FORBIDDEN = {
    "errors": EVERY_FOLDER,  # the ground floor: errors every layer shares
    "_lazy": EVERY_FOLDER,  # lazy public names: the package's import stays light
    "tpu_host": EVERY_FOLDER,
    "rank_correlation": EVERY_FOLDER,  # numpy rank statistics: tasks' and retrieval's metrics
    "cli": EVERY_FOLDER,  # the tools' shared helpers: light, no JAX (--help answers at once)
    "model": {"train", "data", "pretrained", "probing", "io", "tokenizer", "cli", "aot", "tasks",
              "retrieval"},
    # (retrieval is not forbidden here: data's CLI, `jaxencoder-data mine`, calls its mining)
    "data": {"model", "train", "pretrained", "probing", "aot", "tasks"},
    # storage stores trees: the model side converts layouts before saving, after restoring
    "io": {"model", "cli", "train", "data", "pretrained", "probing", "aot", "tasks", "retrieval"},
    # a task: its model, loss, metrics, options and pipeline from the data layer
    "tasks": {"train", "io", "pretrained", "probing", "aot", "retrieval"},
    # exact search and its metrics over any embed(texts) function: no model of its own
    "retrieval": {"model", "train", "pretrained", "probing", "aot", "tasks", "export"},
    "train": {"probing", "aot"},  # train reads pretrained checkpoints (init_from a HF dir)
    "pretrained": {"train", "probing", "aot", "tasks"},
    "probing": {"train", "aot"},
    "aot": {"probing", "pretrained"},  # compiles train's steps; nothing is read
    # jaxencoder.load: reads through pretrained's resolver, predicts through train; the
    # library below never imports it
    "loading": {"probing", "aot", "export", "cli"},
}
for _below in (EVERY_FOLDER | set(FORBIDDEN)) - {"loading"}:
  FORBIDDEN[_below] = FORBIDDEN.get(_below, set()) | {"loading"}
HEAVY = ("tokenizers", "safetensors", "orbax", "grain", "tensorflow_datasets", "tensorboardX")


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
  return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                if import_graph.folder(b) in FORBIDDEN.get(import_graph.folder(a), ()))


def test_no_import_points_the_wrong_way():
  assert wrong_arrows(import_graph.imports(REPO / "jaxencoder")) == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The groups of modules that import each other, directly or round a loop (Tarjan's
  strongly connected components); imports inside functions count too."""
  index, low, stack, cycles = {}, {}, [], []
  def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    for other in sorted(graph.get(module, ())):
      if other not in graph:
        continue
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      group = []
      while not group or group[-1] != module:
        group.append(stack.pop())
      if len(group) > 1:
        cycles.append(sorted(group))
  for module in sorted(graph):
    if module not in index:
      visit(module)
  return sorted(cycles)


def test_no_import_cycles_inside_or_between_folders():
  assert import_cycles(import_graph.imports(REPO / "jaxencoder")) == []


def test_the_cycle_check_catches_a_loop_inside_a_folder():
  graph = {"jaxencoder.train.config": {"jaxencoder.train.datasets"},
           "jaxencoder.train.datasets": {"jaxencoder.train.tasks"},
           "jaxencoder.train.tasks": {"jaxencoder.train.config"},
           "jaxencoder.train.loop": {"jaxencoder.train.tasks"}}
  assert import_cycles(graph) == [["jaxencoder.train.config", "jaxencoder.train.datasets",
                                   "jaxencoder.train.tasks"]]


def test_the_check_catches_a_wrong_arrow():
  graph = {"jaxencoder.model.encoder": {"jaxencoder.train.loop"},
           "jaxencoder.data.pipeline": {"jaxencoder.model.heads"},
           "jaxencoder.train.loop": {"jaxencoder.probing.features", "jaxencoder.io.run_dir"}}
  assert wrong_arrows(graph) == ["jaxencoder.data.pipeline -> jaxencoder.model.heads",
                                 "jaxencoder.model.encoder -> jaxencoder.train.loop",
                                 "jaxencoder.train.loop -> jaxencoder.probing.features"]


# Python files that may import a CLI module (`X.__main__`): the entry points that run one.
ENTRY_POINTS = ("train.py",)  # python train.py: jaxencoder.train.__main__'s main


def cli_modules_imported(path: pathlib.Path) -> set[str]:
  """The `__main__` modules a file imports (`from a.__main__ import b`, `from a import
  __main__`, `import a.__main__`)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.endswith(".__main__")}
    elif isinstance(node, ast.ImportFrom) and node.module:
      if node.module.endswith(".__main__"):
        found.add(node.module)
      found |= {f"{node.module}.__main__" for a in node.names if a.name == "__main__"}
  return found


def imports_of_cli_modules(root: pathlib.Path) -> list[str]:
  """'file -> module' for each import of a CLI module outside tests/ and ENTRY_POINTS: a
  CLI module parses arguments and calls the library; the library lives elsewhere."""
  files = [*root.glob("*.py"), *(f for folder in ("jaxencoder", "bench", "tools", "configs")
                                 for f in (root / folder).rglob("*.py"))]
  return sorted(f"{f.relative_to(root)} -> {module}" for f in files
                if f.name not in ENTRY_POINTS or f.parent != root
                for module in cli_modules_imported(f))


def test_no_module_imports_a_cli_module():
  assert imports_of_cli_modules(REPO) == []


def test_the_check_catches_an_import_of_a_cli_module(tmp_path):
  (tmp_path / "jaxencoder" / "train").mkdir(parents=True)
  (tmp_path / "jaxencoder" / "train" / "init_from.py").write_text(
      "from jaxencoder.pretrained.__main__ import convert\n")
  (tmp_path / "bench").mkdir()
  (tmp_path / "bench" / "b.py").write_text(
      "def f():\n  from jaxencoder.probing import __main__ as probe\n")
  (tmp_path / "train.py").write_text("from jaxencoder.train.__main__ import main\n")
  assert imports_of_cli_modules(tmp_path) == [
      "bench/b.py -> jaxencoder.probing.__main__",
      "jaxencoder/train/init_from.py -> jaxencoder.pretrained.__main__"]


@pytest.mark.parametrize("module,folder", [
    ("jaxencoder", "package"), ("jaxencoder.model.encoder", "model"), ("jaxencoder.train", "train"),
    ("jaxencoder.train.loop", "train"), ("jaxencoder.io.run_dir", "io"),
    ("jaxencoder.tokenizer", "tokenizer"), ("jaxencoder.errors", "errors")])
def test_folder_of_a_module(module, folder):
  assert import_graph.folder(module) == folder


@pytest.mark.slow
def test_import_jaxencoder_loads_the_model_only():
  code = ("import sys, jaxencoder; "
          f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_tasks_and_the_train_step_import_without_the_input_pipeline():
  """An accelerator image without grain or tfds can still build a task and its step
  (bench/train_step.py runs there, loading train's modules under a bare package as
  below); only building a task's pipeline needs them."""
  code = """
import importlib.abc, os, sys, types
class Blocked(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name.split('.')[0] in ('grain', 'tensorflow_datasets'):
      raise ImportError('no ' + name)
sys.meta_path.insert(0, Blocked())
import jaxencoder
from jaxencoder.tasks import registry
train = types.ModuleType('jaxencoder.train')
train.__path__ = [os.path.join(os.path.dirname(jaxencoder.__file__), 'train')]
sys.modules['jaxencoder.train'] = train
from jaxencoder.train import optim, steps
print(sorted(registry.task_names()))
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "mlm" in out.stdout and "classify" in out.stdout


@pytest.mark.parametrize("statement", ["import jaxencoder.flash",
                                       "from jaxencoder import encoder",
                                       "from jaxencoder.config import EncoderConfig"])
def test_an_old_model_module_path_fails_naming_its_new_one(statement):
  """The model's modules moved into jaxencoder/model/ (0.4): the old spelling is one line."""
  done = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True,
                        cwd=REPO)
  assert done.returncode == 1
  old = statement.split()[1] if statement.startswith("import") else (
      statement.split()[1] + "." + statement.split()[3] if " import encoder" in statement
      else statement.split()[1])
  new = old.replace("jaxencoder.", "jaxencoder.model.", 1)
  assert done.stderr.strip().splitlines()[-1] == f"ImportError: {old} moved: import {new}"
