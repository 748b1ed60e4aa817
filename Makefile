# memsvc: `make run` starts the server, `make test` runs the suite. Both create ./.venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned CPU build of torch, installed before anything else: a loose torch requirement
# would pull gigabytes of CUDA wheels.
TORCH := torch==2.13.0

.PHONY: run test lint proto bench-recall bench-ingest bench-async bench-perf clean

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(TORCH)
	$(PIP) install -q --disable-pip-version-check -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q --disable-pip-version-check -e ".[dev]"
	touch $@

run: $(VENV)/.base
	$(VENV)/bin/memsvc serve $(ARGS)

test: $(VENV)/.dev
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check memsvc tests benchmarks
	$(VENV)/bin/ruff format --check memsvc tests benchmarks
	$(VENV)/bin/mypy memsvc

# Regenerate memsvc/v1 from proto/ (generated code is checked in; tests/test_proto.py
# fails if it drifts from the .proto).
proto: $(VENV)/.dev
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. \
		proto/memsvc/v1/memory.proto

bench-ingest: $(VENV)/.dev
	$(PY) benchmarks/locomo_ingest.py $(ARGS)

bench-recall: $(VENV)/.dev
	$(PY) benchmarks/locomo_recall.py $(ARGS)

bench-async: $(VENV)/.dev
	$(PY) benchmarks/async_ingest.py $(ARGS)

bench-perf: $(VENV)/.dev
	$(PY) benchmarks/perf.py $(ARGS)

clean:
	rm -rf $(VENV) data
