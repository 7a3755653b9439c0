# The targets CI and people both call. Everything runs from the project's own .venv.
PY ?= .venv/bin/python

.PHONY: install demo test lint typecheck bench

# Reinstalled whenever pyproject.toml changes, so a new dependency never goes missing.
.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --upgrade pip
	.venv/bin/pip install -e '.[all]' --group dev
	touch .venv/.installed

install: .venv/.installed

demo: install
	$(PY) -m contextfold demo

test: install
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

# One mypy run (strict, configured in pyproject.toml) checks src/contextfold, tests/ and
# benchmarks/.
typecheck: install
	$(PY) -m mypy

bench: install
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done
