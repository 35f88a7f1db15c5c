#!/usr/bin/env bash
# One device call (nvidia-h200-x2) for live control (issue 5): rank stop/restart/crash costs and a
# mid-epoch input-pipeline switch on a JPEG ImageFolder. Results in $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
REPO=$PWD
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')" > "$OUT/env.txt"
( cd /tmp && timeout 300 python3 "$REPO/bench/elastic.py" resnet18 --gpus 0,1 --data synthetic \
    --amp bf16 --channels-last --batch-size 256 --steps-per-epoch 500 --out "$OUT/elastic.json" \
    --log /tmp/el.jsonl ) > "$OUT/elastic.md" 2>&1
grep -h -B2 -A12 -E 'Traceback' /tmp/el.rank*.out | head -60 >> "$OUT/elastic.md"
ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep >> "$OUT/elastic.md" \
    || echo "no process left" >> "$OUT/elastic.md"
python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class 1500 > "$OUT/switch.md" 2>&1
( cd /tmp && timeout 240 python3 "$REPO/bench/settings_switch.py" resnet18 --gpus 0,1 \
    --data imagefolder:/tmp/jpeg --amp bf16 --channels-last --batch-size 128 --epochs 6 \
    --workers 4 --no-prefetch --now 8 --switch workers=12 prefetch=true --log /tmp/sw.jsonl ) \
    >> "$OUT/switch.md" 2>&1
grep -h -B2 -A12 -E 'Traceback' /tmp/sw.rank*.out | head -40 >> "$OUT/switch.md"
cp /tmp/el.jsonl /tmp/sw.jsonl "$OUT/" 2>/dev/null
