#!/usr/bin/env bash
# The CUDA paths on one GPU, after a change to them: ddptui gpus against nvidia-smi, --decode gpu
# and --decode cpu on a small JPEG set (and again under the CUDA sanitizer), and a SIGSTOPped
# lone rank flagged and ended by SIGTERM.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD} PYTHONUNBUFFERED=1
left() { ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep || echo "no process left"; }
rm -rf /tmp/stall.jsonl /tmp/jpeg.jsonl /tmp/cpu.jsonl /tmp/ck
{ nvidia-smi --query-gpu=index,memory.used --format=csv; python3 -m ddptui gpus; } > "$OUT/smoke.txt" 2>&1
python3 bench/make_jpegs.py /tmp/jpeg-smoke --classes 4 --per-class 400 > /dev/null 2>&1
( cd /tmp && timeout 150 python3 -m ddptui run resnet18 --gpus 0 --data imagefolder:/tmp/jpeg-smoke \
    --decode gpu --epochs 2 --amp bf16 --channels-last --batch-size 128 --headless \
    --log /tmp/jpeg.jsonl ) >> "$OUT/smoke.txt" 2>&1
echo "decode gpu exit $?" >> "$OUT/smoke.txt"
( cd /tmp && timeout 150 python3 -m ddptui run resnet18 --gpus 0 --data imagefolder:/tmp/jpeg-smoke \
    --epochs 1 --workers 4 --batch-size 128 --headless --log /tmp/cpu.jsonl ) > /tmp/cpu.txt 2>&1
echo "decode cpu exit $?" >> "$OUT/smoke.txt"; tail -3 /tmp/cpu.txt >> "$OUT/smoke.txt"
# PyTorch's CUDA sanitizer over the side-stream paths (the GPU decoder, the prefetcher, rollback
# points, a checkpoint), enabled in the rank itself; its DataLoader workers' fork server starts
# without it (they cannot start CUDA). It sees what torch dispatches (not nvJPEG's own stream,
# nor the allocator's reuse): the soak (bench/soak.py) is the gate for those.
for d in gpu cpu; do
  rm -rf /tmp/san-$d*
  ( cd /tmp && TORCH_CUDA_SANITIZER=1 timeout 150 python3 -m ddptui run resnet18 --gpus 0 --headless \
      --data imagefolder:/tmp/jpeg-smoke --decode $d --workers 2 --epochs 1 --steps-per-epoch 12 \
      --batch-size 32 --checkpoint-dir /tmp/san-$d-ck --snapshot-every 2 --log /tmp/san-$d.jsonl \
      > /tmp/san-$d.txt 2>&1 )
  echo "sanitizer, decode $d: exit $?, $(cat /tmp/san-$d*.out /tmp/san-$d.txt | grep -c 'CSAN detected') races reported" >> "$OUT/smoke.txt"
done
(cd /tmp && exec python3 -m ddptui run resnet18 --gpus 0 --data synthetic --amp bf16 --epochs 100 \
    --stall-after 4 --checkpoint-dir /tmp/ck --headless --log /tmp/stall.jsonl > /tmp/stall.txt 2>&1) &
main=$!
for i in $(seq 60); do grep -q '"kind":"step"' /tmp/stall.jsonl 2>/dev/null && break; sleep 1; done
sleep 8
victim=$(python3 -c "import json; print([e for e in map(json.loads, open('/tmp/stall.jsonl')) if e['kind']=='rank' and e['rank']==0 and e.get('pid')][-1]['pid'])")
kill -STOP "$victim"; sleep 9; t0=$(date +%s.%N); kill -TERM $main; wait $main; code=$?
echo "stalled lone rank: SIGTERM -> exit $code in $(python3 -c "import time; print(round(time.time()-$t0, 2))") s" >> "$OUT/smoke.txt"
grep -E "stalled|warning|error|interrupted|checkpoint" /tmp/stall.txt | head -8 >> "$OUT/smoke.txt"
python3 -c "
import json
for e in map(json.loads, open('/tmp/stall.jsonl')):
    if e['kind'] == 'gpu':
        g = e
print('last gpu event:', {k: g[k] for k in ('gpu', 'util', 'mem_used', 'sm_clock', 'held_down', 'others')})
" >> "$OUT/smoke.txt"
left >> "$OUT/smoke.txt"
