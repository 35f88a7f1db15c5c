#!/usr/bin/env bash
# Device call 2 (nvidia-h200-x2): the torchrun path's steady img/s, and the JPEG input pipeline on
# GPUs (prefetcher, workers, fp16 GradScaler) with live switches between epochs.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
( cd /tmp && timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m trainer -- \
    resnet18 --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 1 \
    --steps-per-epoch 400 --log /tmp/tr.jsonl ) > "$OUT/torchrun.txt" 2>&1
python3 - >> "$OUT/torchrun.txt" <<'PY'
import json
ev=[json.loads(l) for l in open('/tmp/tr.jsonl')]
for r in (0,1):
    st=[e for e in ev if e['kind']=='step' and e['rank']==r and e['global_step']>=60]
    a,b=st[0],st[-1]; print('rank',r,'steady img/s', round((b['global_step']-a['global_step'])*256/(b['t']-a['t'])))
ep=[e for e in ev if e['kind']=='epoch']; print('epoch seconds', [e['seconds'] for e in ep])
PY
timeout 200 python3 bench/settings_switch.py resnet18 --gpus 0,1 --data shapes --image-size 64 \
    --batch-size 64 --epochs 5 --workers 4 --amp fp16 --channels-last --log /tmp/sw.jsonl \
    --switch workers=1 prefetch=false workers=8,prefetch=true cudnn_benchmark=false > "$OUT/switch.md" 2>&1
grep -h -E 'error|Traceback' /tmp/sw.rank*.out | head -5 >> "$OUT/switch.md"
