#!/usr/bin/env bash
# One device call (nvidia-h200-x2): where launch -> first step goes, plain torchrun vs ddptui.
# Usage on the device: bash bench/launch_device.sh [--imports]   (prints the timelines)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD
ROOT=$PWD
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "(page cache dropped)" || echo "(page cache kept: not permitted)"; }

timeline() {  # $1: log, $2: launch time
python3 - "$1" "$2" <<'PY'
import json, sys
evs = [json.loads(l) for l in open(sys.argv[1])]
t0 = float(sys.argv[2])
for e in evs:
    if e["kind"] in ("message", "rank", "run", "world") or (e["kind"] == "step" and e.get("global_step", 9) < 3):
        print(f"{e['t'] - t0:7.2f} r{e['rank']} {e['kind']:8} {e.get('text') or e.get('state') or e.get('status') or e.get('global_step')}")
PY
}

for round in cold warm; do
  [ $round = cold ] && drop
  echo "== $round: plain phases" 
  BENCH_T0=$(date +%s.%N) python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/launch_phases.py 2>&1 | tail -1
  [ $round = cold ] && drop
  echo "== $round: ddptui run resnet18 --gpus 0,1 --headless"
  rm -f /tmp/run.jsonl; T=$(date +%s.%N)
  ( cd /tmp && timeout 120 python3 -m ddptui run resnet18 --gpus 0,1 --headless --epochs 1 --steps-per-epoch 20 --log /tmp/run.jsonl > /tmp/run.out 2>&1 )
  timeline /tmp/run.jsonl $T; tail -2 /tmp/run.out; tail -3 /tmp/run.rank0.out
done
echo "== warm: ddptui run resnet18 --gpus 0,1 --headless --data synthetic"
rm -f /tmp/run.jsonl; T=$(date +%s.%N)
( cd /tmp && timeout 120 python3 -m ddptui run resnet18 --gpus 0,1 --headless --data synthetic --epochs 1 --steps-per-epoch 20 --log /tmp/run.jsonl > /tmp/run.out 2>&1 )
timeline /tmp/run.jsonl $T; tail -2 /tmp/run.out; tail -3 /tmp/run.rank0.out
if [ "${1:-}" = "--imports" ]; then
  echo "== plain phases, cudnn.benchmark off"
  BENCH_T0=$(date +%s.%N) python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/launch_phases.py --no-benchmark 2>&1 | tail -1
  echo "== import times (warm)"
  for m in torch torchvision trainer.rank_main ddptui.cli ddptui.supervisor; do
    python3 -c "import time; t=time.time(); import $m; print('$m', round(time.time()-t, 2), 's')"
  done
  python3 -X importtime -c "import trainer.rank_main" 2> /tmp/imp.txt; sort -t'|' -k2 -n -r /tmp/imp.txt | head -25
fi
