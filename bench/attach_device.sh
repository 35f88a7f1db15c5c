#!/usr/bin/env bash
# One device call (nvidia-h200-x2): a torchrun job reporting to `ddptui attach` in tmux (issue 7).
# Usage on the device: bash bench/attach_device.sh   (screen and log in $OUT)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD DDPTUI_AUTHKEY=bench-key
cd /tmp
tmux new-session -d -x 160 -y 50 "python3 -m ddptui attach --listen 127.0.0.1:29600 --log /tmp/attach.jsonl; echo EXIT \$? > /tmp/attach.exit"
sleep 3
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m trainer -- resnet18 \
  --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 2 --steps-per-epoch 800 \
  --report 127.0.0.1:29600 > /tmp/torchrun.out 2>&1 &
sleep 25
tmux capture-pane -p > "$OUT/attach-h200x2.txt"
wait
sleep 2; tmux capture-pane -p > "$OUT/attach-h200x2-done.txt"
tmux send-keys q; sleep 5
cat /tmp/attach.exit >> "$OUT/attach-h200x2-done.txt" 2>/dev/null
tail -5 /tmp/torchrun.out > "$OUT/torchrun-tail.txt"
python3 - <<'PY' > "$OUT/attach-summary.txt"
import json, collections
evs = [json.loads(l) for l in open('/tmp/attach.jsonl')]
print(collections.Counter((e['kind'], e['rank']) for e in evs))
print([ (e['rank'], round(e['samples_per_s'])) for e in evs if e['kind'] == 'epoch'])
PY
ps -eo pid,args | grep -E 'ddptui|trainer' | grep -v grep >> "$OUT/attach-summary.txt" || echo "no process left" >> "$OUT/attach-summary.txt"
