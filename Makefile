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

# mypy (strict, configured in pyproject.toml) checks src/contextfold and tests/. One run
# cannot hold two modules named conftest: the nested conftest.py files get a run each.
typecheck: install
	$(PY) -m mypy
	for conftest in $$(find tests -mindepth 2 -name conftest.py | sort); do \
		$(PY) -m mypy $$conftest || exit 1; \
	done

bench: install
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done
