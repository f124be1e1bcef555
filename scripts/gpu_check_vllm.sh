#!/usr/bin/env bash
# Run the vLLM engine tests against the CUDA `vllm` package on a GPU machine.
#
#   bash scripts/gpu_check_vllm.sh            # from the repository root
#
# Creates .venv-gpu (kept between runs), installs the project with the `vllm` extra (the
# pinned CUDA build, not the CPU one) and the test tools, then runs every test marked `vllm`:
# the same tiny model built offline, the same gateway and the same assertions as CPU CI
# (greedy ids and logprobs against transformers, LoRA, KV events, pooling, conformance). On a
# GPU, vLLM uses model runner V2, so the prompt-candidate-ids path (`prompt_logprob_token_ids`)
# is advertised and exercised there as well. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

VENV="${VENV:-.venv-gpu}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e '.[dev,vllm]'

"$VENV/bin/python" - <<'PY'
import torch, vllm
assert torch.cuda.is_available(), "no CUDA device visible: this script checks vLLM on a GPU"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

exec "$VENV/bin/python" -m pytest -m vllm tests/engines/vllm -v -p no:cacheprovider "$@"
