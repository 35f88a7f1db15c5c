#!/usr/bin/env bash
# One device call (one GPU) for issue 14 parts 3 and 4: GPU memory and img/s against the plain
# script (SGD before/after with the tree in .old, then AdamW for three models), and the stall a
# checkpoint costs (resnet50, before/after).
# .old: `rm -rf .old && mkdir .old && git archive <old commit> ddptui trainer | tar -x -C .old`
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
OLD=$PWD/.old
left() { ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep || echo "no process left"; }
nvidia-smi --query-gpu=name,memory.used --format=csv > "$OUT/gpu.txt"
timeout 300 python3 bench/memory.py --optimizer sgd --models resnet18 resnet50 --old "$OLD" \
    --checkpoint-model resnet50 --out "$OUT/sgd.json" > "$OUT/sgd.md" 2>&1
left >> "$OUT/sgd.md"
timeout 270 python3 bench/memory.py --optimizer adamw --models resnet18 resnet50 vit_b_16 \
    --checkpoint-model resnet50 --out "$OUT/adamw.json" > "$OUT/adamw.md" 2>&1
left >> "$OUT/adamw.md"
