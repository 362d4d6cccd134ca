# optgym — `make demo` and `make test` do all setup on a fresh Debian 12 (bookworm).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
APT_PACKAGES := clang-22 llvm-22 llvm-22-dev lld-22 python3-venv gcc make cmake util-linux \
  bear meson ninja-build autoconf automake libtool libtool-bin pkg-config dpkg-dev csmith libcsmith-dev \
  libc6-dev-arm64-cross libstdc++-12-dev-arm64-cross libgcc-12-dev-arm64-cross qemu-user qemu-system-arm \
  picolibc-arm-none-eabi
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: all setup system-deps venv demo demo-quick test test-slow test-research bench check lint format clean

all: test

## Debian packages: clang-22 and its tools come from bookworm-security; the arm64 cross libraries, qemu-user,
## qemu-system-arm and picolibc are for the AArch64 and Cortex-M corpora and tests (docs/targets.md); llvm-22-dev's
## headers build optgym's pass plugin (optgym/toolchain/pass_plugin.py).
system-deps:
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@test -x /usr/lib/llvm-22/bin/clang || { echo "clang-22 did not install"; exit 1; }

$(VENV)/.installed: pyproject.toml scripts/optgym-cc scripts/optgym-llvm-ar
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	@# bytecode up front: optgym-cc runs once per compile, and PYTHONDONTWRITEBYTECODE would recompile it each time
	$(VENV)/bin/python -m compileall -q src >/dev/null
	@touch $@

venv: $(VENV)/.installed

setup: system-deps venv
	@# optgym's pass plugin, built against llvm-22-dev's headers once (else on a linkage policy's first compile)
	@$(VENV)/bin/python -m optgym.toolchain.pass_plugin >/dev/null
## Learning on real code (Debian's demo packages → split → ES → report on the held-out package),
## timed: installation included, and the pipeline alone.
demo:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory setup && $(VENV)/bin/optgym doctor && $(VENV)/bin/optgym demo -o demo-out; \
	status=$$?; echo "make demo: $$(( $$(date +%s) - start )) s in all, installation included"; exit $$status

## The 30-second tour: four bundled programs, heuristic / random / never-inline policies.
demo-quick: setup
	$(VENV)/bin/optgym demo --bundled -o demo-out-quick

## The default suite (< 15 min on 2 cores): real clang-22 on real bitcode; slow cases excluded.
test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-slow: setup
	$(VENV)/bin/python -m pytest -m slow $(PYTEST_ARGS)

## The research scripts' own tests (research/: experiments, not the product).
test-research: setup
	$(VENV)/bin/python -m pytest -m research $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/host_overhead.py
	$(VENV)/bin/python bench/front_door.py

## What CI runs before the tests (.ci/run): ruff, the import layers and cycles (.importlinter), the types (mypy).
check: venv
	$(VENV)/bin/ruff check src tests bench research maintainer
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy src

lint: venv
	$(VENV)/bin/ruff check src tests bench research maintainer
	$(VENV)/bin/ruff format --check src tests bench research maintainer

format: venv
	$(VENV)/bin/ruff format src tests bench research maintainer
	$(VENV)/bin/ruff check --fix src tests bench research maintainer

clean:
	rm -rf demo-out demo-out-quick .pytest_cache build dist src/*.egg-info
