#!/usr/bin/env bash
# Device call (nvidia-h200-x2), issue 6: what telemetry costs, and the dashboard in tmux against
# the plain script. Results in $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 bench/telemetry_cost.py --model resnet18 --gpus 2 --short 60 --long 400 \
    > "$OUT/telemetry.md" 2>&1
timeout 100 python3 bench/compare.py --models resnet18 --gpus 2 --steps 400 --warmup 60 \
    > "$OUT/compare.md" 2>&1
rm -f /tmp/tui.exit
tmux new-session -d -x 160 -y 50 "cd /tmp && python3 -m ddptui run resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 1 --steps-per-epoch 800 --log /tmp/tui.jsonl; echo EXIT \$? > /tmp/tui.exit"
sleep 32; tmux capture-pane -p > "$OUT/dashboard-tmux.txt"
for i in $(seq 60); do [ -f /tmp/tui.exit ] && break; sleep 1; done
cat /tmp/tui.exit >> "$OUT/dashboard-tmux.txt" 2>/dev/null
python3 - >> "$OUT/compare.md" <<'PY'
import json
evs = [json.loads(l) for l in open('/tmp/tui.jsonl')]
rate = 0
for r in (0, 1):
    st = [e for e in evs if e['kind'] == 'step' and e['rank'] == r and e['global_step'] >= 60]
    rate += (st[-1]['global_step'] - st[0]['global_step']) * 256 / (st[-1]['t'] - st[0]['t'])
print(f"dashboard in tmux (160x50), same window: {rate:,.0f} img/s")
PY
