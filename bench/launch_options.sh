#!/usr/bin/env bash
# Device call (nvidia-h200-x2), issue 6: which option costs launch -> first step. Each line: the
# rank-0 timeline (seconds from launch) of a 10-step synthetic run with one option changed.
# Usage on the device: bash bench/launch_options.sh
set -u
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeline() {
python3 - "$1" "$2" <<'PY'
import json, sys
evs = [json.loads(l) for l in open(sys.argv[1])]
t0 = float(sys.argv[2])
out = []
for e in evs:
    if e["rank"] == 0 and (e["kind"] == "message" or (e["kind"] == "step" and e.get("global_step", 9) < 3)):
        out.append(f"{e['t'] - t0:.2f} {(e.get('text') or str(e.get('global_step')))[:28]}")
print(" | ".join(out))
PY
}
for extra in "" "--snapshot-every 0" "--telemetry-hz 0" "--no-cudnn-benchmark" "--snapshot-every 0 --telemetry-hz 0"; do
  for model in resnet18 resnet50; do
    rm -f /tmp/p.jsonl; T=$(date +%s.%N)
    ( cd /tmp && timeout 90 python3 -m ddptui run $model --gpus 0,1 --headless --data synthetic --amp bf16 --channels-last --batch-size 256 --epochs 1 --steps-per-epoch 10 --log /tmp/p.jsonl $extra > /dev/null 2>&1 )
    echo "$model [$extra]: $(timeline /tmp/p.jsonl $T)"
  done
done
