#!/usr/bin/env bash
# bench/elastic.py RUNS times on nvidia-h200-x2, keeping each run's event log and rank output.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
REPO=$PWD
for i in $(seq 1 "${RUNS:-3}"); do
  rm -f /tmp/el.*
  ( cd /tmp && PYTHONPATH=/tmp/site:$REPO timeout "${LIMIT:-150}" python3 "$REPO/bench/elastic.py" resnet18 \
      --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256 --steps-per-epoch 500 \
      --out "$OUT/elastic$i.json" --log /tmp/el.jsonl ) > "$OUT/elastic$i.md" 2>&1
  echo "run $i exit $?" >> "$OUT/elastic$i.md"
  mkdir -p "$OUT/run$i"; cp /tmp/el.* "$OUT/run$i/" 2>/dev/null
  ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep >> "$OUT/elastic$i.md"
  pkill -9 -f 'trainer|multiprocessing' 2>/dev/null; sleep 1
done
grep -h "^| [rks]\|exit" "$OUT"/elastic*.md
