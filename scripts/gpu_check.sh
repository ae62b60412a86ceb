#!/usr/bin/env bash
# `make gpu-check`: the checks that need a CUDA device, in one short run (about 5 minutes on one GPU), written to
# results/gpu/ (or $OUT on the lent device machine). Needs torch with CUDA and the `vllm` package in the venv
# (make install TORCH_SPEC=torch && make install-vllm VLLM_SPEC=vllm). Run it whenever a GPU machine is available.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results/gpu}"
mkdir -p "$out"
PY="${PY:-.venv/bin/python}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
  PYTHONUNBUFFERED=1 $PY -m pytest -q -s -m gpu tests/test_gpu.py tests/test_dist.py tests/test_precision.py -p no:cacheprovider 2>&1 | grep -v " INFO \| WARNING "
} 2>&1 | tee "$out/gpu_check.txt"
