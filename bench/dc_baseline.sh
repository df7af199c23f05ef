#!/usr/bin/env bash
# Data-center baseline on a GPU machine: the ResNet-50 teacher through the agent with NVML telemetry, at
# batch 1 and at a throughput batch, fp32 and fp16, on each road: the Torch runner, Torch-TensorRT (where
# torch_tensorrt imports) and ONNX -> TensorRT (where tensorrt imports), side by side (a few minutes each).
# A road whose library does not import is NOT measured and its output line says so, with the import's error.
# Needs torch, torchvision, nvidia-ml-py and the agent's dependencies (fastapi, uvicorn, httpx, onnx,
# onnxruntime, psutil): pip install -e '.[device,nvml]' next to a CUDA build of torch; for the other roads
# torch-tensorrt (pip install -e '.[torch-tensorrt]') and TensorRT (NVIDIA's container: docker/dc.Dockerfile).
# Results: bench/results/dc-baseline-*.json and .md (the README's data-center table).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export OMP_WAIT_POLICY=PASSIVE
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ["torch", "torchvision", "pynvml", "fastapi", "uvicorn", "httpx", "onnx", "onnxruntime", "psutil", "yaml", "cv2"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
    echo "error: missing Python modules: $missing" >&2
    echo "  fix: pip install -e '.[device,nvml]' (with a CUDA build of torch and torchvision)" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv || true
exec "$PYTHON" bench/dc_baseline.py "$@"
