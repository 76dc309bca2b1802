# obsspec: the two set-up commands are `make demo` and `make test`; each installs first if needed.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install install-podman demo test test-fast bench clean

# The venv is rebuilt when pyproject.toml changes. bubblewrap (the sandbox), faketime (the
# pinned clock inside it) and chromium (the report's headless-browser test) are Debian
# packages; they are installed when missing.
install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null && command -v chromium >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 -o -n "$$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null)" ] || { \
	  echo "installing Debian packages: bubblewrap faketime chromium"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap faketime chromium >/dev/null; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip >/dev/null
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

# The Podman backend (tasks with a Dockerfile, sandbox.backend=podman): podman, its runtime runc
# and mmdebstrap (the offline base image). Installed when missing.
install-podman:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null || { \
	  echo "installing Debian packages: podman runc mmdebstrap"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null; }

demo: install
	$(BIN)/obsspec demo

# Fast unit tests and the integration tests (real sandbox, real CLI, tiny local models).
test: install
	$(BIN)/python -m pytest -q --durations=15 -m "not gpu" tests

# The developer's loop: everything but the slow tier (tests/conftest.py), in under a minute.
test-fast: install
	$(BIN)/python -m pytest -q --durations=5 -m "not gpu and not slow" tests

bench: install
	$(BIN)/python bench/sandbox_overhead.py

clean:
	rm -rf $(VENV) runs .cache
