# The two commands of the README: `make demo` runs the main job, `make test` runs the tests.
# Both create (or reuse) .venv, install torch first so that a CPU machine never pulls a CUDA
# build, then the project, then fetch what they need into ~/.cache/draftwatch.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup image

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

setup: $(STAMP)

# DEMO_ARGS=--quick runs the small model with the n-gram drafter; --exit stops after the summary.
DEMO_ARGS ?=

demo: $(STAMP)
	$(BIN)/draftwatch demo $(DEMO_ARGS)

test: $(STAMP)
	bash scripts/ensure-chromium.sh
	bash scripts/ensure-prometheus.sh
	bash scripts/ensure-podman.sh
	PYTHON=$(PYTHON) bash scripts/ensure-litellm.sh
	PYTHON=$(BIN)/python bash scripts/ensure-llama-server.sh
	$(BIN)/draftwatch models fetch smollm2-135m
	$(BIN)/ruff check .
	$(BIN)/mypy decoder monitor dashboard
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy decoder monitor dashboard

# The two images (Containerfile), labelled with the project's version and the repository they come from:
# SOURCE defaults to the checkout's origin as a URL (an scp-style git@host:path made https, any user and
# password in it dropped); `make image SOURCE=https://...` where there is none.
CONTAINER ?= podman
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)
SOURCE ?= $(shell git remote get-url origin 2>/dev/null | sed -E 's#^git@([^:/]+):#https://\1/#; s#^([a-z+]+://)[^@/]*@#\1#; s#\.git$$##')

image:
	@test -n "$(SOURCE)" || { echo "make image: the checkout has no origin remote: pass SOURCE=<repository URL>" >&2; exit 2; }
	$(CONTAINER) build --format docker --build-arg VERSION=$(VERSION) --build-arg SOURCE=$(SOURCE) \
		-t draftwatch:$(VERSION) .
	$(CONTAINER) build --format docker --build-arg VERSION=$(VERSION) --build-arg SOURCE=$(SOURCE) \
		--target dashboard -t draftwatch-dashboard:$(VERSION) .
