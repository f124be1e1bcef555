#!/usr/bin/env bash
# Run the SGLang engine tests against the real `sglang` package on a GPU machine.
#
#   bash scripts/gpu_check_sglang.sh            # from the repository root
#
# Creates .venv-sglang-gpu (kept between runs; .venv-sglang is CI's CPU environment for SGLang's real
# classes), installs the project with the `sglang` extra (SGLang 0.5.23, CUDA only) and the test tools,
# then runs every test marked `sglang`: the tiny Llama the vLLM tests build offline (no model download),
# served by the driver behind an in-process gateway, with the gateway's tokens, logprobs and scores
# compared against the same SGLang engine called directly; abort, load, health, KV events from SGLang's
# ZMQ publisher (salted and unsalted prefixes, per attention-DP rank), guided decoding, LoRA, a
# prefill/decode pair on SGLang's `fake` transfer backend as two gateways (one SGLang engine each, the
# decode one the real command), SIGTERM ending a real SGLang gateway with exit 0 and no process left,
# SIGTERM under load draining it (streams in flight at the signal complete, a request sent once the
# gateway logged the signal is refused UNAVAILABLE, exit 0: `-k drains` runs that one alone),
# the gateway's logging surviving SGLang's start, data-parallel attention (skipped with fewer than two
# GPUs), and the conformance kit. About 1 GB of GPU memory per engine. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

VENV="${VENV:-.venv-sglang-gpu}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e '.[dev,sglang]'

"$VENV/bin/python" - <<'PY'
import torch, sglang
assert torch.cuda.is_available(), "no CUDA device visible: this script checks SGLang on a GPU"
print(f"sglang {sglang.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

exec "$VENV/bin/python" -m pytest -m sglang tests/engines/sglang -v -p no:cacheprovider "$@"
