"""The package's layers: imports point one way, and `import jaxencoder` stays light."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import import_graph  # noqa: E402

# folder -> folders it must not import ("model" = the top-level model modules).
FORBIDDEN = {
    "model": {"train", "data", "pretrained", "probing", "io", "tokenizer", "cli", "aot"},
    "data": {"model", "train", "pretrained", "probing", "aot"},
    "io": {"train", "data", "pretrained", "probing", "aot"},
    "train": {"probing", "aot"},  # train reads pretrained checkpoints (init_from a HF dir)
    "pretrained": {"train", "probing", "aot"},
    "probing": {"train", "aot"},
    "aot": {"probing", "pretrained"},  # compiles train's steps; nothing is read
}
HEAVY = ("tokenizers", "safetensors", "orbax", "grain", "tensorflow_datasets", "tensorboardX")


def wrong_arrows(graph: dict[str, set[str]]) -> list[str]:
  return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                if import_graph.folder(b) in FORBIDDEN.get(import_graph.folder(a), ()))


def test_no_import_points_the_wrong_way():
  assert wrong_arrows(import_graph.imports(REPO / "jaxencoder")) == []


def test_the_check_catches_a_wrong_arrow():
  graph = {"jaxencoder.encoder": {"jaxencoder.train.loop"},
           "jaxencoder.data.pipeline": {"jaxencoder.heads"},
           "jaxencoder.train.loop": {"jaxencoder.probing.features", "jaxencoder.io.run_dir"}}
  assert wrong_arrows(graph) == ["jaxencoder.data.pipeline -> jaxencoder.heads",
                                 "jaxencoder.encoder -> jaxencoder.train.loop",
                                 "jaxencoder.train.loop -> jaxencoder.probing.features"]


@pytest.mark.parametrize("module,folder", [
    ("jaxencoder", "model"), ("jaxencoder.encoder", "model"), ("jaxencoder.train", "train"),
    ("jaxencoder.train.loop", "train"), ("jaxencoder.io.run_dir", "io"),
    ("jaxencoder.tokenizer", "tokenizer")])
def test_folder_of_a_module(module, folder):
  assert import_graph.folder(module) == folder


def test_import_jaxencoder_loads_the_model_only():
  code = ("import sys, jaxencoder; "
          f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
