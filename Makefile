# `make run` and `make test` each set up .venv (CPU PyTorch first, then the
# project) and then do their job. Nothing else is needed on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-avx2 setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU build of PyTorch first, so that nothing pulls a CUDA wheel.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/edge-infer serve

# A worker per core (pytest-xdist; tests/conftest.py pins each to its own), a file's tests on one worker.
XDIST := -n auto --dist loadfile

test: $(STAMP)
	$(PY) -m pytest $(XDIST)

test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m 'not slow'

# The whole suite as an AVX2-only CPU (no AVX-512, VNNI or bf16) sees it: edge-infer's capability
# model and PyTorch's and oneDNN's dispatch all masked. For developers on AVX-512 machines.
test-avx2: $(STAMP)
	EDGE_INFER_CPU_FEATURES=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $(PY) -m pytest $(XDIST)

clean:
	rm -rf $(VENV) build dist src/*.egg-info
