# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := runs/demo

.PHONY: demo test lint typecheck bench venv clean

venv: $(STAMP)

# torch is installed first and pinned by constraints.txt so pip takes the CPU build from local disk.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/brisk theory tpf --a 0.9,0.85,0.8,0.8,0.75,0.7,0.7
	$(BIN)/brisk theory figure --stride 8 --out $(DEMO)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -n 2

bench: $(STAMP)
	$(BIN)/python benchmarks/theory_bench.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .hypothesis
