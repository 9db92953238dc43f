# The two commands of the README: `make run` trains the default job, `make test` passes the whole suite.
# Both install what is missing first (a virtual environment in .venv, reused while pyproject.toml is unchanged).
PYTHON ?= python3
VENV ?= .venv
# CPU wheel by default (fast, and what CI uses). On a GPU cluster, see README "Installing on a cluster (CUDA)".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
# pytest-xdist workers of `make test`: one more than the usable cores, at most 6 (on 2 cores, 2 workers kept them
# 154 % busy: the tests also wait on subprocesses, services and signals); tests/xdist_groups.py keeps the
# integration tests on one of them
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 < 6 ? n + 1 : 6 )))
STAMP := $(VENV)/.hpctrain-installed

.PHONY: install run test lint bench clean-venv

# Says what it did, or that nothing was needed, and how to use what it made.
install: $(STAMP)
	@echo "$(VENV) is ready: hpctrain $$($(BIN)/python -c 'from importlib.metadata import version; print(version("hpctrain"))'), torch $$($(BIN)/python -c 'from importlib.metadata import version; print(version("torch"))'); use it with: source $(VENV)/bin/activate (or $(BIN)/hpctrain)"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "make install: creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -c "import torch" 2>/dev/null || { echo "make install: installing $(TORCH_SPEC) (a few minutes)"; $(BIN)/python -m pip install -q $(TORCH_SPEC); }
	@echo "make install: installing hpctrain and its dependencies into $(VENV)"
	@$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/hpctrain train $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check src tests bench
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

test: $(STAMP)
	@hpc/local-cluster install
	@hpc/install-browser
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
