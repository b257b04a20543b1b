# Every target sets up .venv first. torch is pinned and installed before the package so
# pip never resolves a CUDA build of it. The environment is byte-compiled once, on every
# core (compileall -j 0: 13 s of CPU, where pip's own compile, file by file, takes 70 s):
# where PYTHONDONTWRITEBYTECODE is set, as in many CI images, no later import caches
# its bytecode, and every test process would compile torch again. (compileall exits 1
# on the few files of the dependencies that are not Python 3, as pip's compile skips
# them.)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
DEMO_DIR ?= runs/demo

.PHONY: setup test test-oldest docs demo bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile "$(TORCH_PIN)"
	$(PY) -m pip install --quiet --no-compile -e ".[dev,docs]"
	-$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null
	touch $@

# The fast-path tests run twice: on whatever this CPU offers, then on the portable path
# (oneDNN and ATen limited to AVX2, and every ebmlab CPU fast path off). The numerical
# packages run once more on ATen's plain kernels (no vector units), whose summation
# order differs from every vectorised one: a tolerance that holds on one CPU only fails
# here, not on a user's machine. (tests/conformance is not among them: it compares a
# simulated device with the CPU, both on the same kernels; nor are the tests marked
# slow, long statistical runs whose tolerances are Monte Carlo errors, far above any
# kernel's rounding.) The whole suite runs on every core, one test file per worker
# (tests/conftest.py shares the threads out). The documentation site is built beside
# the fast-path run, which keeps one core busy at most; either failing fails the target.
PORTABLE := ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 EBMLAB_CPU_FAST_PATHS=0
NUMERICAL := tests/partition tests/samplers tests/energies tests/transport tests/test_convergence.py
# the files that hold the fastpath-marked tests (tests/test_packaging.py keeps this list
# whole): the pass collects these alone, not the whole suite
FASTPATH := tests/test_hardware.py tests/energies/test_base.py tests/energies/test_classifier.py \
	tests/partition/test_ais.py

# The test run caches bytecode in the tree (ebmlab's modules, pytest's rewritten test
# modules) even where PYTHONDONTWRITEBYTECODE is set: else every pytest worker of the
# three runs and every process the suite starts compiles them again (4 s a collection).
test: export PYTHONDONTWRITEBYTECODE =
test: setup
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(MKDOCS) -q & site=$$!; $(PORTABLE) $(PY) -m pytest -m fastpath $(FASTPATH); code=$$?; \
	wait $$site && exit $$code
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -n auto --dist loadfile -m "not slow" $(NUMERICAL)
	$(PY) -m pytest -n auto --dist loadfile

# The suite on the oldest releases pyproject.toml allows (the last patch of each floor),
# in an environment of its own; torch stays at TORCH_PIN, the one CPU wheel at hand.
# tests/test_packaging.py keeps these pins on pyproject.toml's floors.
OLDEST := numpy==1.24.4 scipy==1.10.1 scikit-learn==1.6.0 matplotlib==3.7.0 tqdm==4.60.0 \
	pillow==9.1.0 pandas==2.0.3
OLDEST_VENV ?= .venv-oldest

test-oldest:
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install --quiet "$(TORCH_PIN)" $(OLDEST) pytest pytest-xdist hypothesis
	$(OLDEST_VENV)/bin/pip install --quiet --no-deps -e .
	$(OLDEST_VENV)/bin/python -m pytest -n auto --dist loadfile

# The documentation site (mkdocs, Material theme, API pages from the docstrings) into
# site/; any warning fails the build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs: setup
	$(MKDOCS)

# Typed again after Ctrl-C, it continues the run where it stopped.
demo: setup
	$(VENV)/bin/ebmlab train jem --seed 0 --out $(DEMO_DIR) --auto-resume
	$(VENV)/bin/ebmlab evaluate $(DEMO_DIR)

bench: setup
	$(PY) -m benchmarks.run

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks docs

clean:
	rm -rf $(VENV) runs site .pytest_cache
