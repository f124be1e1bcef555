"""The SGLang driver against a real SGLang engine (GPU machines only: ``scripts/gpu_check_sglang.sh``)."""
