#!/usr/bin/env bash
# Device call (nvidia-h200-x2), issue 6: a 500x375 JPEG ImageFolder through the best plain loader
# and through ddptui's pipelines (CPU decode, GPU decode with and without the prefetching thread,
# autotune). Results in $OUT/pipeline.md.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
[ -d /tmp/jpeg ] || python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class 4000 > "$OUT/pipeline.md" 2>&1
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/plain_jpeg.py \
    /tmp/jpeg --workers 12 >> "$OUT/pipeline.md" 2>&1
for opts in "--decode gpu --workers 6" "--decode gpu --workers 12" "--decode gpu --workers 12 --no-prefetch" \
            "--decode cpu --workers 12"; do
  timeout 100 python3 bench/pipeline.py /tmp/jpeg -- $opts --epochs 1 >> "$OUT/pipeline.md" 2>&1
done
timeout 150 python3 bench/pipeline.py /tmp/jpeg -- --decode gpu --autotune --epochs 14 \
    >> "$OUT/pipeline.md" 2>&1
