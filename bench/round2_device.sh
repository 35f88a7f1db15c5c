#!/usr/bin/env bash
# One device call (nvidia-h200-x2) for issue 6: launch -> first step (cold and warm), the JPEG
# pipeline with the threaded GPU decode, and telemetry's cost measured in-process. $OUT gets it all.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
bash bench/launch_device.sh > "$OUT/launch.txt" 2>&1
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/telemetry_cost.py \
    --blocks 20 --steps 100 > "$OUT/telemetry.md" 2>&1
bash bench/pipeline_device.sh
