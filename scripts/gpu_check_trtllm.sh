#!/usr/bin/env bash
# Run the TensorRT-LLM engine tests against the real engine on a GPU machine.
#
#   bash scripts/gpu_check_trtllm.sh                       # from the repository root
#   PYTHON=/opt/trtllm/bin/python bash scripts/gpu_check_trtllm.sh -k limits   # extra arguments go to pytest
#
# Takes an already-installed TensorRT-LLM and never installs it: GPU machines often cannot reach
# NVIDIA's package index (or any index). PYTHON is an interpreter whose environment imports
# tensorrt_llm (default: .venv-trtllm/bin/python when that exists, else python3); the driver serves
# 1.2.1 (and later 1.2 releases) and 1.3 from 1.3.0rc29, so run the script once per release, each in
# its own environment. Where the environment can reach an index, install one beforehand with
#   python3.12 -m venv .venv-trtllm && .venv-trtllm/bin/pip install --extra-index-url https://pypi.nvidia.com \
#       'tensorrt-llm==1.2.1'    # or 'tensorrt-llm==1.3.0rc29'
# The project goes into that environment editable and without dependencies (offline); the gateway's
# own dependencies and the test tools must be there already (the script names any that are missing).
#
# Every test marked `trtllm` runs on the tiny Llama the vLLM tests build offline (no model download):
#   1. test_generation.py: the knobs TorchSampler ignores refused with INVALID_ARGUMENT; streamed deltas
#      against TensorRT-LLM's own results, stops, guidance (xgrammar), cache salt, KV events, abort, load;
#   2. test_limits.py: the advertised context (max_num_tokens 256 under max_seq_len 512, no chunked
#      prefill: 257) against TensorRT-LLM's own refusal of a prompt one token longer (issue 35, item 1);
#      docs/backends/trtllm.md's --lora-config example starting, and '{"max_loras": 4}' refused with exit
#      status 2 naming lora_target_modules before the model loads (item 4); the engine's version is one the
#      driver serves (item 7: run once per release);
#   3. test_disaggregation.py: a prefill/decode pair, each engine in its own `openengine-gateway` process,
#      the decode side resuming the prefill's session two seconds late, so a prefill whose result was not
#      final at its handoff must not have been aborted (item 2), matching the engine's own greedy tokens,
#      and Abort(kv_session) answering ALREADY_FINISHED;
#   4. test_conformance.py: the conformance kit on the aggregated engine.
# Engines share the GPU (10% of its free memory each for the KV cache).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv-trtllm/bin/python ]; then PYTHON=.venv-trtllm/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import tensorrt_llm' >/dev/null 2>&1; then
    echo "$PYTHON cannot import tensorrt_llm: install TensorRT-LLM first (see the top of this script)," \
        "or point PYTHON at an environment that has it" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import openengine_gateway, openengine_backends' >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .
fi
"$PYTHON" - <<'PY'
import importlib.util, sys
wanted = ["grpc", "grpc_health", "grpc_reflection", "google.protobuf", "stevedore", "pydantic", "numpy", "regex",
          "prometheus_client", "msgpack", "zmq", "pytest", "pytest_asyncio", "pytest_timeout", "transformers"]
missing = [name for name in wanted if importlib.util.find_spec(name.split(".")[0]) is None]
if missing:
    sys.exit(f"missing in this environment: {', '.join(missing)} (pip install -e '.[dev]' where an index is reachable)")
import torch, tensorrt_llm
from openengine_backends.trtllm.versions import check_version
assert torch.cuda.is_available(), "no CUDA device visible: this script checks TensorRT-LLM on a GPU"
check_version(tensorrt_llm.__version__)
print(f"tensorrt_llm {tensorrt_llm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

# An engine takes minutes to build and warm, inside the first test that needs it: past pytest's 300 s default.
exec "$PYTHON" -m pytest -m trtllm -v -p no:cacheprovider --timeout 1800 \
    tests/engines/trtllm/test_generation.py \
    tests/engines/trtllm/test_limits.py \
    tests/engines/trtllm/test_disaggregation.py \
    tests/engines/trtllm/test_conformance.py \
    "$@"
