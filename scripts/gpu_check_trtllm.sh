#!/usr/bin/env bash
# Run the TensorRT-LLM engine tests against the real engine on a GPU machine.
#
#   bash scripts/gpu_check_trtllm.sh            # from the repository root
#   bash scripts/gpu_check_trtllm.sh -k refused # extra arguments go to pytest
#
# Creates .venv-trtllm (kept between runs) with a Python TensorRT-LLM publishes wheels for
# (3.12: TensorRT-LLM's wheels are for 3.10 and 3.12, the gateway needs 3.11+), installs the project with the `trtllm` extra
# (tensorrt-llm==1.2.1, from NVIDIA's package index) and the test tools, then runs every test
# marked `trtllm` on the tiny Llama the vLLM tests build offline (no model download), in this order:
#   1. test_generation.py: the knobs TensorRT-LLM 1.2.1's TorchSampler ignores (seed, min_p, the
#      three penalties) refused with INVALID_ARGUMENT; a request without knobs sampling rather than
#      decoding greedily; streamed deltas against TensorRT-LLM's own results, stops, guidance
#      (xgrammar), cache salt, KV events, abort, load, health;
#   2. test_disaggregation.py: a prefill/decode pair, each engine in its own `openengine-gateway`
#      process (the prefill forced to disable_overlap_scheduler), the decode side resuming the
#      prefill's PrefillReady session and matching the engine's own greedy tokens, and
#      Abort(kv_session) answering ALREADY_FINISHED (supports_abort_cleanup is false);
#   3. test_conformance.py: the conformance kit on the aggregated engine.
# Three engines share the GPU (10% of its free memory each for the KV cache).
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

# An engine takes minutes to build and warm, inside the first test that needs it: past pytest's 300 s default.
exec "$VENV/bin/python" -m pytest -m trtllm -v -p no:cacheprovider --timeout 1800 \
    tests/engines/trtllm/test_generation.py \
    tests/engines/trtllm/test_disaggregation.py \
    tests/engines/trtllm/test_conformance.py \
    "$@"
