#!/usr/bin/env bash
# Run the TensorRT-LLM engine tests against the real engine on a GPU machine.
#
#   bash scripts/gpu_check_trtllm.sh            # from the repository root
#
# Creates .venv-trtllm (kept between runs) with a Python TensorRT-LLM publishes wheels for
# (3.12: TensorRT-LLM's wheels are for 3.10 and 3.12, the gateway needs 3.11+), installs the project with the `trtllm` extra
# (tensorrt-llm==1.2.1, from NVIDIA's package index) and the test tools, then runs every test
# marked `trtllm`: the tiny Llama the vLLM tests build offline, served through the gateway;
# streamed deltas against TensorRT-LLM's own results, stops, seeds, guidance (xgrammar), cache
# salt, KV events, abort, load, health, and the conformance kit. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

VENV="${VENV:-.venv-trtllm}"
PYTHON="${PYTHON:-python3.12}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q --extra-index-url https://pypi.nvidia.com -e '.[dev,trtllm]'

"$VENV/bin/python" - <<'PY'
import torch, tensorrt_llm
assert torch.cuda.is_available(), "no CUDA device visible: this script checks TensorRT-LLM on a GPU"
print(f"tensorrt_llm {tensorrt_llm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

exec "$VENV/bin/python" -m pytest -m trtllm tests/engines/trtllm -v -p no:cacheprovider "$@"
