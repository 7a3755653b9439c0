# The targets CI and people both call. Everything runs from the project's own .venv, installed
# exactly as uv.lock says: a fresh clone tests what the last green run tested.
PY ?= .venv/bin/python
PYTHON ?= python3
# uv itself is pinned and kept in its own environment, out of the one it manages.
UV_VERSION := 0.13.10
UV := .tools/bin/uv
# The extras and the dev and docs groups, as one set of arguments for every environment.
EXTRAS := --all-extras --group dev --group docs

.PHONY: install demo test lint typecheck bench lock test-latest test-lowest local-model docs \
	docs-serve

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/python -m pip install --quiet 'uv==$(UV_VERSION)'

# Installed again whenever pyproject.toml or the lock changes, so a dependency never goes
# missing and none is newer than the lock.
.venv/.installed: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen $(EXTRAS) --python $(PYTHON)
	touch .venv/.installed

install: .venv/.installed

demo: install
	$(PY) -m contextfold demo

# llama.cpp's server and a small model, built once into a cache outside the repository
# (about 11 CPU-minutes the first time): the real model the suite and the benchmarks talk to.
local-model:
	$(PYTHON) .ci/local-model

test: install local-model
	$(PY) -m pytest -q

# Upgrades every locked dependency to its newest release; commit the new uv.lock on its own.
lock: $(UV)
	$(UV) lock --upgrade --python $(PYTHON)

# An environment of its own holding exactly one resolution of every extra and the dev group
# ($(1): the environment, $(2): uv's resolution flags), then the project itself, editable.
define resolved_env
	$(UV) venv --quiet --clear --python $(PYTHON) $(1)
	$(UV) pip compile --quiet pyproject.toml $(EXTRAS) $(2) --python $(1)/bin/python \
		-o $(1)/requirements.txt
	$(UV) pip sync --quiet --python $(1)/bin/python $(1)/requirements.txt
	$(UV) pip install --quiet --python $(1)/bin/python --no-deps -e .
endef

# The suite against the newest release of every dependency: a framework release that breaks
# an adapter fails here first, not in main's CI.
test-latest: $(UV) local-model
	$(call resolved_env,.venv-latest,--upgrade)
	.venv-latest/bin/python -m pytest -q

# The suite against the lower bounds pyproject.toml publishes for users (each direct
# dependency at its oldest allowed release).
test-lowest: $(UV) local-model
	$(call resolved_env,.venv-lowest,--resolution lowest-direct)
	.venv-lowest/bin/python -m pytest -q

lint: install
	$(PY) -m ruff check src tests benchmarks docs/_hooks
	$(PY) -m ruff format --check src tests benchmarks docs/_hooks

# One mypy run (strict, configured in pyproject.toml) checks src/contextfold, tests/,
# benchmarks/ and the docs' build hooks.
typecheck: install
	$(PY) -m mypy

bench: install local-model
	for script in benchmarks/*.py; do $(PY) $$script || exit 1; done

# The documentation site (mkdocs.yml, pages in docs/), built strictly into build/site: a broken
# link or anchor, a page left out of the navigation, a public name without a reference entry
# or a missing screenshot fails. The inspector's screenshots are taken first, from the demo
# in headless Chromium, so the pictures show the current UI. (Material's notice about its
# successor is silenced: it is not a problem of this site.)
DOCS_SCREENSHOTS := build/docs-screenshots
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs

docs: install
	$(PY) -m docs._hooks.screenshots $(DOCS_SCREENSHOTS)
	$(MKDOCS) build --strict

# The site at http://127.0.0.1:8000/, rebuilt as pages change.
docs-serve: install
	$(PY) -m docs._hooks.screenshots $(DOCS_SCREENSHOTS)
	$(MKDOCS) serve
