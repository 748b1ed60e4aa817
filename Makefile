# memsvc: `make run` starts the server, `make test` runs the suite. Both create ./.venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned CPU build of torch, installed before anything else: a loose torch requirement
# would pull gigabytes of CUDA wheels.
TORCH := torch==2.13.0

.PHONY: run test test-fleet eval lint proto bench-recall bench-ingest bench-async bench-perf bench-resilience bench-fleet bench-peer-venv clean soak proto-check test-clients

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

# Two pytest workers: most tests wait on child servers, the model or Milvus Lite, so two
# processes on two cores finish in ~5 min instead of ~8.
TEST_WORKERS ?= 2
test: $(VENV)/.dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Three replicas on one PostgreSQL log and one Milvus server, in child processes (in order:
# the tests share the fleet; one kills a replica, the last restarts the database).
test-fleet: $(VENV)/.dev
	$(PY) -m pytest -q -m fleet -p no:cacheprovider tests/fleet $(PYTEST_ARGS)

# Long randomized run of the write-path state machine (MEMSVC_SOAK_EXAMPLES, default 1000).
soak: $(VENV)/.dev
	$(PY) -m pytest -q -m soak -p no:cacheprovider --timeout=0 tests/test_integrity_stateful.py $(PYTEST_ARGS)

# LoCoMo checks on real conversations (data outside the repo, CC BY-NC 4.0).
EVAL_FILE ?= ../shared/eval/locomo-dev.json
eval: $(VENV)/.dev
	@test -f "$(EVAL_FILE)" || { echo "make eval: $(EVAL_FILE) not found." \
		"Point EVAL_FILE at LoCoMo's locomo-dev.json: make eval EVAL_FILE=/path/to/file" >&2; exit 2; }
	EVAL_FILE="$(abspath $(EVAL_FILE))" $(PY) -m pytest -q -s evals $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check memsvc tests evals benchmarks
	$(VENV)/bin/ruff format --check memsvc tests evals benchmarks
	$(VENV)/bin/mypy memsvc
	$(VENV)/bin/lint-imports

# Regenerate memsvc/v1 from proto/ (generated code is checked in; tests/test_proto.py
# fails if it drifts from the .proto).
proto: $(VENV)/.dev
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. \
		proto/memsvc/v1/memory.proto

# Contract checks and clients in other languages (npm registry; lockfile committed).
BUF := clients/node_modules/.bin/buf
clients/node_modules/.installed: clients/package.json clients/package-lock.json
	# npm ci refuses this lockfile: the registry here lacks the optional buf binaries of other
	# platforms; install resolves from the lockfile all the same.
	cd clients && npm install --no-audit --no-fund
	touch $@

proto-check: clients/node_modules/.installed
	$(BUF) lint
	$(BUF) format --exit-code > /dev/null
	$(BUF) breaking --against proto/released/memsvc-v1.binpb

test-clients: $(VENV)/.dev clients/node_modules/.installed
	cd clients && npm test

bench-ingest: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/locomo_ingest.py $(ARGS)

bench-recall: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/locomo_recall.py $(ARGS)

bench-async: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/async_ingest.py $(ARGS)

bench-resilience: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/resilience.py $(ARGS)

# 1, 2 and 3 replicas on one PostgreSQL (started from the machine's binaries) and one
# milvus-lite TCP server; LISTEN/NOTIFY against polling.
bench-fleet: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/fleet.py $(ARGS)

# bench-perf also runs the LangChain peer (benchmarks/peer_langchain.py) when .venv-peer exists.
bench-perf: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/perf.py $(ARGS)

PEER_VENV := .venv-peer
bench-peer-venv: benchmarks/peer-requirements.txt
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q --disable-pip-version-check $(TORCH)
	$(PEER_VENV)/bin/pip install -q --disable-pip-version-check -r benchmarks/peer-requirements.txt

clean:
	rm -rf $(VENV) $(PEER_VENV) data clients/node_modules clients/ts/gen
