# ragmesh — every task a developer or CI runs. Everything installs into .venv/.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
export BUF_CACHE_DIR := $(abspath .cache/buf)
PROTO_FILES := $(shell find proto -name '*.proto' | sort)
GEN_DIR := gen/python
# The client package (clients/python) carries its own copy of the public contracts (and the ones
# they import), under ragmesh_client._pb with imports rewritten, so that it installs alone and
# never shadows the project's ragmesh.* modules. Produced by `make proto` only.
CLIENT_PB := clients/python/src/ragmesh_client/_pb
CLIENT_CONTRACTS := common extractor gateway ingestion narrator planner
SCIFACT ?= ../shared/bench/scifact
STAMP := $(VENV)/.installed

.PHONY: setup proto proto-check lint fmt typecheck buf-check breaking check test test-unit test-integration \
        up down status demo bench clean lock reranker-model deploy-check chaos gpu-check peer-bench \
        rules-check size-bench control-plane-bench

setup: $(STAMP)

# Reinstall only when the lock or the project metadata changes.
$(STAMP): requirements.lock pyproject.toml clients/python/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e clients/python
	@touch $(STAMP)

# $(call client_pb,GENERATED_DIR,DEST): the client's copy of the contracts it needs.
define client_pb
	rm -rf $(2) && mkdir -p $(2) && touch $(2)/__init__.py
	for c in $(CLIENT_CONTRACTS); do cp -r $(1)/ragmesh/$$c $(2)/; done
	find $(2) -name __pycache__ -prune -exec rm -rf {} \;
	find $(2) \( -name '*.py' -o -name '*.pyi' \) -exec sed -i -E \
		's/^from ragmesh\./from ragmesh_client._pb./; s/^import ragmesh\./import ragmesh_client._pb./' {} +
endef

# Regenerate the Python code for every contract in proto/ (never edit gen/ by hand).
proto: setup
	rm -rf $(GEN_DIR) && mkdir -p $(GEN_DIR)
	$(PY) -m grpc_tools.protoc -I proto --python_out=$(GEN_DIR) --pyi_out=$(GEN_DIR) \
		--grpc_python_out=$(GEN_DIR) $(PROTO_FILES)
	find $(GEN_DIR)/ragmesh -type d -exec touch {}/__init__.py \;
	$(call client_pb,$(GEN_DIR),$(CLIENT_PB))

# CI: the committed generated code must match what `make proto` produces now.
proto-check: setup
	rm -rf .cache/gen-check && mkdir -p .cache/gen-check
	$(PY) -m grpc_tools.protoc -I proto --python_out=.cache/gen-check --pyi_out=.cache/gen-check \
		--grpc_python_out=.cache/gen-check $(PROTO_FILES)
	find .cache/gen-check/ragmesh -type d -exec touch {}/__init__.py \;
	diff -r -x __pycache__ .cache/gen-check/ragmesh $(GEN_DIR)/ragmesh || \
		{ echo "gen/ is stale: run 'make proto' and commit"; exit 1; }
	$(call client_pb,.cache/gen-check,.cache/gen-check-client)
	diff -r -x __pycache__ .cache/gen-check-client $(CLIENT_PB) || \
		{ echo "$(CLIENT_PB) is stale: run 'make proto' and commit"; exit 1; }

buf-check: setup
	$(BIN)/buf lint
	$(BIN)/buf format -d --exit-code

# Contracts must not break what landed: against origin/main where it differs from HEAD (a
# developer checkout), else against the previous commit (CI's clone of the submitted main).
breaking: setup
	@if git rev-parse -q --verify origin/main >/dev/null && \
	    [ "$$(git rev-parse origin/main)" != "$$(git rev-parse HEAD)" ]; then \
		base=$$(git merge-base HEAD origin/main); \
	elif git rev-parse -q --verify HEAD~1 >/dev/null; then base=HEAD~1; \
	else echo "no earlier commit: buf breaking skipped"; exit 0; fi; \
	if git cat-file -e "$$base:buf.yaml" 2>/dev/null; then \
		echo "buf breaking against $$base"; $(BIN)/buf breaking --against ".git#ref=$$base"; \
	else echo "no contracts at $$base: buf breaking skipped"; fi

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: setup
	$(BIN)/mypy libs/meshkit services cli/ragmesh_cli bench clients/python/src/ragmesh_client

# Render both kustomize overlays, validate them offline against the Kubernetes schemas, lint
# the Dockerfiles (hadolint).
deploy-check: setup
	deploy/k8s/validate.sh

# The Prometheus alert rules (deploy/prometheus/) parse and pass their unit tests. promtool comes
# with Debian's prometheus package (.ci/run installs it).
PROMTOOL ?= promtool
rules-check: setup
	@command -v $(PROMTOOL) >/dev/null || \
		{ echo "promtool not found: apt-get install prometheus (or PROMTOOL=/path/to/promtool)"; exit 1; }
	$(PROMTOOL) check rules deploy/prometheus/ragmesh-rules.yml
	cd deploy/prometheus && $(PROMTOOL) test rules tests/*.test.yml
	$(PY) -m json.tool deploy/grafana/ragmesh-stages.json >/dev/null

check: lint typecheck buf-check proto-check breaking deploy-check rules-check

test: setup
	$(BIN)/pytest -q

test-unit: setup
	$(BIN)/pytest -q -m "not integration"

test-integration: setup
	$(BIN)/pytest -q -m integration

# Ten minutes of the write path under random SIGKILLs with production timings (the CI run of
# tests/integration/test_chaos.py is a short schedule); the report goes to .cache/chaos-report.json.
CHAOS_SECONDS ?= 600
chaos: setup
	mkdir -p .cache
	RAGMESH_CHAOS_SECONDS=$(CHAOS_SECONDS) RAGMESH_CHAOS_REPORT=$(abspath .cache/chaos-report.json) \
		$(BIN)/pytest -q -s -m integration tests/integration/test_chaos.py

up: setup
	$(BIN)/ragmesh up

down: setup
	$(BIN)/ragmesh down

status: setup
	$(BIN)/ragmesh status

# The main job on the embedded default: the local mesh, SciFact ingested end to end, then a
# cited answer to one question, extractive and from the local LLM (streamed as it is written).
demo: setup
	$(BIN)/ragmesh up
	$(BIN)/ragmesh ingest $(SCIFACT)/corpus.jsonl.gz --collection scifact --wait
	$(BIN)/ragmesh status --collection scifact
	$(BIN)/ragmesh ask "Does vitamin D supplementation reduce the risk of fractures?" --collection scifact --mode extractive
	$(BIN)/ragmesh ask "Does vitamin D supplementation reduce the risk of fractures?" --collection scifact --mode llm

# Each benchmark measures its comparisons side by side in one run; see docs/BENCHMARKS.md.
bench: setup
	$(PY) -m bench.loadtest_bench
	$(PY) -m bench.exact_bench --corpus $(SCIFACT)/corpus.jsonl.gz
	$(PY) -m bench.ingest_bench --dataset $(SCIFACT)
	$(PY) -m bench.search_bench --dataset $(SCIFACT) --json
	$(PY) -m bench.faiss_threads --json
	$(PY) -m bench.rerank_bench --dataset $(SCIFACT) --json
	$(PY) -m bench.scale_bench --dataset $(SCIFACT)

# ragmesh against Haystack and LanceDB on SciFact with the same vectors (docs/BENCHMARKS.md, "Against
# the peers"). Installs the pyproject `bench` extra alone (the lock as constraints, so nothing the
# services run changes); GATEWAY=HOST:PORT of a running mesh holding SciFact in PEER_COLLECTION.
GATEWAY ?=
PEER_COLLECTION ?= scifact
PEER_BENCH_ARGS ?=
peer-bench: setup
	@mkdir -p .cache
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]))' > .cache/bench-extra.txt
	$(PY) -m pip install --quiet -c requirements.lock -r .cache/bench-extra.txt
	$(PY) -m bench.peer_bench --dataset $(SCIFACT) $(if $(GATEWAY),--gateway $(GATEWAY)) \
		--collection $(PEER_COLLECTION) --json $(PEER_BENCH_ARGS)

# Cost against corpus size (docs/SCALE.md): its own stack, one synthetic collection filled to each of
# SIZES in turn, one JSON line per size. Installs the pyproject `scale` extra (matplotlib, for the
# plots of --write-doc) as peer-bench installs `bench`: the lock as constraints, never in the image.
SIZES ?= 10000,100000,1000000
SIZE_BENCH_ARGS ?= --json --write-doc
size-bench: setup
	@mkdir -p .cache
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["scale"]))' > .cache/scale-extra.txt
	$(PY) -m pip install --quiet -c requirements.lock -r .cache/scale-extra.txt
	$(PY) -m bench.size_bench --sizes $(SIZES) $(SIZE_BENCH_ARGS)

# The control plane against document count (docs/SCALE.md): the status index alone, then the
# ingestion API end to end with DOCS documents recorded (start, RSS, pages, unchanged-folder syncs).
DOCS ?= 1000000
control-plane-bench: setup
	$(PY) -m bench.control_plane_bench --sizes 10000,100000,$(DOCS)
	$(PY) -m bench.ingestion_start_bench --docs $(DOCS) --folders 10000,100000 --json

# The GPU tiers in one command (under 8 minutes on a machine with an NVIDIA GPU): onnxruntime-gpu and
# vLLM in their own venvs under .cache/gpu-venv/, the embedder and reranker on CUDA next to the CPU,
# SmolLM2 served by vLLM through the narrator; one JSON summary as the last line. Without a GPU
# the CUDA stages are skipped (exit 2). GPU_CHECK_ARGS: e.g. --wheels DIR (offline), --cpu-only.
gpu-check: setup
	$(PY) -m bench.gpu_check $(GPU_CHECK_ARGS)

# Train the default cross-encoder into models/reranker/ (about 45 min on 2 CPU cores). torch is
# installed for this build only; serving never imports it.
reranker-model: setup
	$(PY) -m pip install --quiet -r requirements-build.txt
	$(PY) -m ragmesh_cli.rerankerbuild.build --dataset $(SCIFACT)

lock:
	@echo "edit requirements.lock by hand or from 'pip freeze' of a working venv (torch excluded)"

clean:
	rm -rf .cache .ragmesh
