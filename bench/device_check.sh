#!/usr/bin/env bash
# One device call (nvidia-h200-x2): issue checks and the throughput comparison, results in $OUT.
# Usage on the device: bash bench/device_check.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$OUT/env.txt"
python3 -m ddptui gpus | tee "$OUT/gpus.txt"

# Issue 2: the trainer under torchrun on both GPUs.
( cd /tmp && timeout 180 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m trainer -- \
    resnet18 --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 1 \
    --steps-per-epoch 300 --log /tmp/torchrun.jsonl ) > "$OUT/torchrun.txt" 2>&1
python3 - <<'PY' >> "$OUT/torchrun.txt"
import json
evs=[json.loads(l) for l in open('/tmp/torchrun.jsonl')]
ep=[e for e in evs if e['kind']=='epoch']; gpu=[e for e in evs if e['kind']=='gpu' and e.get('util') is not None]
print('epoch img/s per rank', [round(e['samples_per_s']) for e in ep], 'total', round(sum(e['samples_per_s'] for e in ep)))
print('nvml samples', len(gpu), 'gpus', sorted({e['gpu'] for e in gpu}), 'max util', max(e['util'] for e in gpu), 'mem MiB', max(e['mem_used'] for e in gpu))
PY

# Issue 6 (part): ddptui vs the plain script.
timeout 380 python3 bench/compare.py --models resnet18 resnet50 --gpus 1 2 --steps 200 --warmup 50 \
    --out "$OUT/compare.json" 2>&1 | tee "$OUT/compare.md"

# Issue 4: the dashboard in tmux with real GPU bars; then q, and nothing left behind.
cd /tmp && tmux new-session -d -x 160 -y 50 "cd /tmp && python3 -m ddptui run resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 3 --steps-per-epoch 400 --log /tmp/tui.jsonl; echo EXIT \$? > /tmp/tui.exit"
sleep 45; tmux capture-pane -p > "$OUT/dashboard-160x50.txt"
tmux send-keys q; sleep 12; cat /tmp/tui.exit >> "$OUT/dashboard-160x50.txt" 2>/dev/null
ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep >> "$OUT/dashboard-160x50.txt" || echo "no process left" >> "$OUT/dashboard-160x50.txt"
python3 - <<'PY' >> "$OUT/dashboard-160x50.txt"
import json
evs=[json.loads(l) for l in open('/tmp/tui.jsonl')]
run=[e for e in evs if e['kind']=='run']; st=[e for e in evs if e['kind']=='step' and e['rank']==0]
print('run events', [(e['status'], e.get('exit_code')) for e in run]); print('launch->first step', round(st[0]['t']-run[0]['t'],2), 's')
PY
