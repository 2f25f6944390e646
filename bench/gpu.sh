#!/usr/bin/env bash
# Issue 16's GPU rows, prepared for a CUDA machine that has only torch and transformers (no rollnet
# dependencies, no vLLM, nothing to fetch). It carries only what it needs: rollnet's toploc and sampler
# modules (numpy and torch alone) and bench/gpu_rows.py, copied into a scratch folder, so nothing else of
# rollnet is importable there. A random Qwen2.5-0.5B-shaped model in bf16 on CUDA; generation tokens/s at
# batch 1, 8 and 64, verification speed against generation, the proofs' share, and whether honest CUDA
# rollouts pass verification on CUDA, and on this machine's CPU in fp32 (a GPU worker, a CPU validator).
# Bounded by a 470 s watchdog (the budget is 8 minutes).
#   bash bench/gpu.sh                      # writes $OUT/gpu_rows.json (or ./gpu_rows.json)
#   bash bench/gpu.sh --device cpu --shape tiny --batches 1,4   # a smoke run anywhere
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp "$root/node/toploc.py" "$root/node/rollout/sampler.py" "$root/bench/gpu_rows.py" "$scratch/"
out="${OUT:-$PWD}"
python="${PYTHON:-python3}"
"$python" -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__,
"| cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
cd "$scratch"
timeout "${GPU_ROWS_TIMEOUT:-470}" "$python" gpu_rows.py --json "$out/gpu_rows.json" "$@"
