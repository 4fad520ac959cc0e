# tracedash: `make run` serves on embedded defaults; `make test` runs the tests.
# Both create .venv and install the pinned dependencies first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check
OPENLIT_VENV ?= .venv-openlit

.PHONY: run test install install-dev lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.lock | $(BIN)/python
	@echo "tracedash: installing pinned dependencies into $(VENV) (first time takes a minute)…"
	$(PIP) install --progress-bar on -r requirements.lock
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.lock $(OPENLIT_VENV)/.installed
	@echo "tracedash: installing pinned test dependencies into $(VENV)…"
	$(PIP) install --progress-bar on -r requirements-dev.lock
	@touch $@

# OpenLIT's own environment for tests/test_llm_clients.py (its dependencies conflict with .venv's:
# see requirements-openlit.lock).
$(OPENLIT_VENV)/.installed: requirements-openlit.lock
	@echo "tracedash: installing OpenLIT's test environment into $(OPENLIT_VENV)…"
	$(PYTHON) -m venv $(OPENLIT_VENV)
	$(OPENLIT_VENV)/bin/python -m pip --disable-pip-version-check install --progress-bar on -r requirements-openlit.lock
	@touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: $(VENV)/.installed
	$(BIN)/python manage.py serve

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Re-freeze the lock files from requirements*.in (run after changing a direct dependency).
lock:
	rm -rf .lockvenv && $(PYTHON) -m venv .lockvenv
	.lockvenv/bin/pip install -q -r requirements.in
	(echo "# Full pinned runtime set, frozen from requirements.in by \`make lock\`. Install with: pip install -r requirements.lock"; \
	 .lockvenv/bin/pip freeze | grep -v '^pip==') > requirements.lock
	.lockvenv/bin/pip install -q -r requirements-dev.in
	(echo "# Full pinned test set: requirements.lock plus requirements-dev.in, frozen by \`make lock\`."; echo "-r requirements.lock"; \
	 .lockvenv/bin/pip freeze | grep -v '^pip==' | grep -vxF -f requirements.lock) > requirements-dev.lock
	rm -rf .lockvenv

clean:
	rm -rf $(VENV) $(OPENLIT_VENV)
