# memsvc: `make run` starts the server, `make test` runs the suite. Both create ./.venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned CPU build of torch, installed before anything else: a loose torch requirement
# would pull gigabytes of CUDA wheels.
TORCH := torch==2.13.0
# Where the CPU build comes from: empty = the configured index (here its CPU wheel); on a
# machine whose pip points at PyPI, TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu.
TORCH_INDEX_URL ?=
TORCH_FROM := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))

.PHONY: run test check docs reference test-fleet test-browser test-embedders test-install infinity-venv bench-embedders eval lint proto bench-recall bench-ingest bench-session bench-adk bench-async bench-perf bench-tracing bench-start bench-scale bench-scale-plot bench-resilience bench-fleet bench-peer-venv clean soak proto-check test-clients test-clients-node test-clients-python test-clients-go

$(VENV)/.base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(TORCH_FROM) $(TORCH)
	$(PIP) install -q --disable-pip-version-check -e ".[local]"
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q --disable-pip-version-check -e ".[local,dev,otel]"
	touch $@

run: $(VENV)/.base
	$(VENV)/bin/memsvc serve $(ARGS)

# Three pytest workers on two cores: most tests wait on child servers, the model or Milvus
# Lite (785 s against 905-975 s with two, AMD EPYC 2 cores, 2026-11-28; with four, 463 s
# against 457 s and 9 % more CPU, 2026-12-02). Tests that
# share a module's server carry an xdist_group mark (loadgroup): one worker runs them all,
# so that server starts once. The slowest tests are printed at the end (the profile in
# docs/development.md).
TEST_WORKERS ?= 3
test: $(VENV)/.dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

# The edit loop: lint, then the tests that need no server, model or database (seconds).
CHECK_TESTS := tests/test_config.py tests/test_text.py tests/test_prefix.py tests/test_terms.py \
	tests/test_bm25.py \
	tests/test_deadline.py tests/test_docs.py tests/test_model_identity.py \
	tests/integration/test_dns_rebinding.py::test_host_policy \
	tests/integration/test_dns_rebinding.py::test_origin_policy \
	tests/test_tracing.py::test_the_standard_variables_turn_traces_on \
	tests/test_tracing.py::test_an_unknown_exporter_or_protocol_stops_the_start_naming_it \
	tests/test_tracing.py::test_every_stage_in_the_code_is_named_where_operators_read_it
check: lint
	$(PY) -m pytest -q -p no:cacheprovider $(CHECK_TESTS) $(PYTEST_ARGS)

# Three replicas on one PostgreSQL log and one Milvus server, in child processes (in order:
# the tests share the fleet; one kills a replica, the last restarts the database).
test-fleet: $(VENV)/.dev
	$(PY) -m pytest -q -m fleet -p no:cacheprovider tests/fleet $(PYTEST_ARGS)

# An install without cloning: docs/operations/deploy.md's pip lines run as written in an
# empty venv outside the repository (this clone as the git address), then its server called.
test-install: $(VENV)/.dev
	MEMSVC_TEST_TORCH_FROM="$(TORCH_FROM)" \
		$(PY) -m pytest -q -m install -p no:cacheprovider tests/install $(PYTEST_ARGS)

# Browser tests: Debian's Chromium (apt-get install chromium; MEMSVC_TEST_CHROMIUM for
# another path) driven by Playwright against memsvc in a child process.
# The console's tests also take the README's pictures of it (docs/console/).
test-browser: $(VENV)/.dev
	MEMSVC_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console \
		$(PY) -m pytest -q -m browser -p no:cacheprovider tests/browser $(PYTEST_ARGS)

# Embedding through a real OpenAI-compatible server: Infinity (in .venv-infinity, torch
# first as for memsvc) serving the bundled model. What differs between providers runs
# again through it (the tests marked `providers`: its vectors in every search mode, the
# server's token counts in the layout, its calls under deletes and concurrent writes), on
# the SQLite log only (the log does not meet the embedder; the rest of those suites, and
# the state machine, exercise the log and the store, the same for every provider, so they
# run once, in make test); then tests/embedders (parity, faults, identity, the slim
# install, the alert), a file per worker: each worker starts its own Infinity, and the
# alert's minute-long outage runs beside the rest.
INFINITY_VENV := .venv-infinity
$(INFINITY_VENV)/.done: tests/infinity-requirements.txt
	test -x $(INFINITY_VENV)/bin/python || $(PYTHON) -m venv $(INFINITY_VENV)
	$(INFINITY_VENV)/bin/pip install -q --disable-pip-version-check $(TORCH_FROM) $(TORCH)
	$(INFINITY_VENV)/bin/pip install -q --disable-pip-version-check -r tests/infinity-requirements.txt
	touch $@
infinity-venv: $(INFINITY_VENV)/.done

REMOTE_SUITES := tests/test_search.py tests/test_integrity.py tests/test_chunking.py
test-embedders: $(VENV)/.dev $(INFINITY_VENV)/.done
	$(PY) -m tests.support.embedding_server $(PY) -m pytest -q -n $(TEST_WORKERS) \
		-p no:cacheprovider -m providers -k "not postgres" $(REMOTE_SUITES) $(PYTEST_ARGS)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m embedders -p no:cacheprovider \
		tests/embedders $(PYTEST_ARGS)

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
	$(VENV)/bin/ruff check memsvc tests evals benchmarks tools examples clients/python
	$(VENV)/bin/ruff format --check memsvc tests evals benchmarks tools examples clients/python
	$(PY) clients/python/stubs.py
	# The two mypy runs side by side (a core each), each with its own cache: runs of
	# different options sharing one cache rebuild it for each other (61 s "warm", not 1.5).
	$(VENV)/bin/mypy --cache-dir .mypy_cache/client --strict --exclude 'memsvc_client/v1/' \
		--follow-imports=silent clients/python/memsvc_client & client=$$!; \
		$(VENV)/bin/mypy memsvc tools; server=$$?; wait $$client; client=$$?; \
		test $$server = 0 && test $$client = 0
	$(VENV)/bin/lint-imports

# Regenerate memsvc/v1 from proto/ (generated code is checked in; tests/test_proto.py
# fails if it drifts from the .proto).
proto: $(VENV)/.dev
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. \
		proto/memsvc/v1/memory.proto
	# the HTTP surface's OpenAPI description, from the same proto and its comments
	$(PY) -m memsvc.transports.http.openapi proto/memsvc/v1/memory.proto proto > memsvc/v1/openapi.json
	# clients/python (memsvc-client) takes these stubs at its build: clients/python/stubs.py

# The docs site (docs/, mkdocs.yml) into site/; a broken link or an unlisted page fails.
docs: $(VENV)/.dev
	$(PY) -m mkdocs build --strict

# docs/reference/: settings, metrics, error reasons and the API, generated from the code.
reference: $(VENV)/.dev
	$(PY) -m tools.reference

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

# The Python client in a venv of its own, without torch or the server's package.
CLIENT_VENV := clients/python/.venv
# The frameworks at the versions their cases were checked against (constraints.txt).
$(CLIENT_VENV)/.installed: clients/python/pyproject.toml clients/python/constraints.txt
	test -x $(CLIENT_VENV)/bin/python || $(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install -q --disable-pip-version-check \
		-c clients/python/constraints.txt "./clients/python[langchain,openai-agents,llama-index,google-adk]"
	touch $@

# CrewAI pins openai < 3 and mcp < 2, older than the other frameworks': a venv of its own
CREWAI_VENV := clients/python/.venv-crewai
$(CREWAI_VENV)/.installed: clients/python/pyproject.toml
	test -x $(CREWAI_VENV)/bin/python || $(PYTHON) -m venv $(CREWAI_VENV)
	$(CREWAI_VENV)/bin/python -m pip install -q --disable-pip-version-check ./clients/python crewai==1.15.30
	touch $@

# Three independent parts (each starts servers of its own): `make -j3 --output-sync=target
# test-clients` runs them side by side, as .ci/run does.
test-clients: test-clients-node test-clients-python test-clients-go
test-clients-node: $(VENV)/.dev clients/node_modules/.installed
	cd clients && npm test
test-clients-python: $(VENV)/.dev $(CLIENT_VENV)/.installed $(CREWAI_VENV)/.installed
	$(PY) clients/python/stubs.py
	$(CLIENT_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		--force-reinstall ./clients/python
	cd clients/python && MEMSVC_PYTHON=$(abspath $(PY)) .venv/bin/python -m unittest discover \
		-s tests -t . -v
	$(CREWAI_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		--force-reinstall ./clients/python
	cd clients/python && MEMSVC_PYTHON=$(abspath $(PY)) .venv-crewai/bin/python -m unittest \
		discover -s tests_crewai -t . -v
# Go: when a toolchain is present (.ci/run installs Debian's; README lists the packages)
test-clients-go: $(VENV)/.dev
	if command -v go >/dev/null; then bash clients/go/run.sh; \
	else echo "test-clients: no Go toolchain, the Go client was not built"; fi

bench-ingest: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/locomo_ingest.py $(ARGS)

# LoCoMo dev (chat and fact-shaped) and BEAM dev, MiniLM in process and behind Infinity,
# then multilingual-e5-small; then MemoryBank dev, Chinese and English, for both models.
bench-recall: $(VENV)/.dev $(INFINITY_VENV)/.done
	PYTHONPATH=. $(PY) benchmarks/recall.py --remote $(ARGS)
	PYTHONPATH=. $(PY) benchmarks/recall.py --model e5 $(ARGS)
	PYTHONPATH=. $(PY) benchmarks/memorybank.py

# ADK adds as a user's memory grows: 100, 1,000 and 10,000 stored events (client venv).
bench-adk: $(VENV)/.dev $(CLIENT_VENV)/.installed
	$(CLIENT_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		--force-reinstall ./clients/python
	MEMSVC_PYTHON=$(abspath $(PY)) $(CLIENT_VENV)/bin/python benchmarks/adk_add.py $(ARGS)

# MemsvcSession's pop_item and clear_session against the SDK's SQLiteSession (client venv).
bench-session: $(VENV)/.dev $(CLIENT_VENV)/.installed
	$(CLIENT_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps \
		--force-reinstall ./clients/python
	MEMSVC_PYTHON=$(abspath $(PY)) $(CLIENT_VENV)/bin/python benchmarks/session_pop.py $(ARGS)

bench-async: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/async_ingest.py $(ARGS)

bench-resilience: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/resilience.py $(ARGS)

# 1, 2 and 3 replicas on one PostgreSQL (started from the machine's binaries) and one
# milvus-lite TCP server; LISTEN/NOTIFY against polling.
bench-fleet: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/fleet.py $(ARGS)

# bench-perf also runs the LangChain peer (benchmarks/peer_langchain.py) when .venv-peer exists,
# and ends with bench-tracing: hybrid p50 with traces off, and their cost on.
bench-perf: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/perf.py $(ARGS)
	PYTHONPATH=. $(PY) benchmarks/tracing.py $(TRACING_ARGS)

# What traces cost: hybrid search with tracing off and on at 100 % sampling, one data dir.
bench-tracing: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/tracing.py $(ARGS)

# What one node holds as conversations pile up (benchmarks/scale.py; not in CI: about an hour
# to 100,000 conversations on 2 cores). Vectors from a deterministic embedding server of its own.
# Start times (issue 84): first start on a machine, a later one, a new data dir; three each
# (ARGS="--load 6" beside busy processes). Not in CI.
bench-start: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/start.py $(ARGS)

bench-scale: $(VENV)/.dev
	PYTHONPATH=. $(PY) benchmarks/scale.py $(ARGS)

# The curves of bench-scale runs (their --json files) as one PNG; matplotlib installed here
# on first use (not a dependency of memsvc): make bench-scale-plot ARGS="run.json --out f.png"
bench-scale-plot: $(VENV)/.dev
	$(PY) -c "import matplotlib" 2>/dev/null || $(PIP) install -q --disable-pip-version-check matplotlib==3.11.2
	$(PY) benchmarks/scale_plot.py $(ARGS)

# The local model against the same model behind Infinity (.venv-infinity, make infinity-venv).
bench-embedders: $(VENV)/.dev $(INFINITY_VENV)/.done
	PYTHONPATH=. $(PY) benchmarks/embedders.py $(ARGS)

PEER_VENV := .venv-peer
bench-peer-venv: benchmarks/peer-requirements.txt
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q --disable-pip-version-check $(TORCH)
	$(PEER_VENV)/bin/pip install -q --disable-pip-version-check -r benchmarks/peer-requirements.txt

clean:
	rm -rf $(VENV) $(PEER_VENV) $(INFINITY_VENV) data clients/node_modules clients/ts/gen
