#!/usr/bin/env bash
# Issue 16 on the largest machine lent (nvidia-h200-x8, else -x4): every figure at N GPUs beside
# the plain torchrun script. A command may run 10 minutes, so the measurement comes in parts:
#   bash bench/eight_device.sh steady     compare.py, resnet18 and resnet50 at 1, N/2 and N GPUs
#   bash bench/eight_device.sh live       the dashboard with N ranks captured at 160x50 and 120x40,
#                                         a join through it (s, r), the elastic table at N, a stall
#   bash bench/eight_device.sh pipeline   --decode gpu / cpu against the plain loader at N GPUs
# Results under $OUT; each part ends by listing any process left behind.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
REPO=$PWD
N=$(nvidia-smi -L | wc -l)
GPUS=$(seq -s, 0 $((N - 1)))
R18="resnet18 --gpus $GPUS --data synthetic --amp bf16 --channels-last --batch-size 256"
left() { ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing|pt_data_worker' | grep -v grep \
         || echo "no process left"; }
nvidia-smi -L > "$OUT/machine.txt"; nproc >> "$OUT/machine.txt"

case "${1:-}" in
steady)
  timeout 560 python3 bench/compare.py --models resnet18 resnet50 --gpus 1 $((N / 2)) "$N" \
      --steps 200 --warmup 40 --out "$OUT/compare.json" > "$OUT/compare.md" 2>&1
  left >> "$OUT/compare.md" ;;
live)
  # The dashboard at 160x50, then the same window at 120x40, mid-run.
  cd /tmp && rm -f /tmp/tui.jsonl
  tmux new-session -d -s eight -x 160 -y 50 "cd /tmp && python3 -m ddptui run $R18 --epochs 100 \
      --log /tmp/tui.jsonl; echo EXIT \$? > /tmp/tui.exit"
  for i in $(seq 90); do grep -q '"kind":"step"' /tmp/tui.jsonl 2>/dev/null && break; sleep 1; done
  sleep 20; tmux capture-pane -p -t eight > "$OUT/dashboard-h200x$N-160x50.txt"
  tmux resize-window -t eight -x 120 -y 40; sleep 3
  tmux capture-pane -p -t eight > "$OUT/dashboard-h200x$N-120x40.txt"
  tmux send-keys -t eight q; sleep 1; tmux send-keys -t eight y
  for i in $(seq 100); do [ -f /tmp/tui.exit ] && break; sleep 0.2; done
  cat /tmp/tui.exit >> "$OUT/dashboard-h200x$N-160x50.txt" 2>/dev/null
  tmux kill-session -t eight 2>/dev/null
  cd "$REPO"
  timeout 150 python3 bench/join_tmux.py $R18 --rounds 2 > "$OUT/join.md" 2>&1
  ( cd /tmp && timeout 200 python3 "$REPO/bench/elastic.py" $R18 --out "$OUT/elastic.json" ) \
      > "$OUT/elastic.md" 2>&1
  ( cd /tmp && timeout 150 python3 "$REPO/bench/stall.py" $R18 --steps-per-epoch 500 \
      --out "$OUT/stall.json" --log /tmp/stall.jsonl ) > "$OUT/stall.md" 2>&1
  left >> "$OUT/stall.md" ;;
pipeline)
  [ -d /tmp/jpeg ] || python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class 8000 \
      > "$OUT/pipeline.md" 2>&1
  W=$(( $(nproc) / N - 1 ))
  timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node "$N" \
      bench/plain_jpeg.py /tmp/jpeg --workers "$W" >> "$OUT/pipeline.md" 2>&1
  for opts in "--decode gpu" "--decode cpu"; do
    timeout 150 python3 bench/pipeline.py /tmp/jpeg --gpus "$GPUS" -- $opts --epochs 1 \
        >> "$OUT/pipeline.md" 2>&1
  done
  left >> "$OUT/pipeline.md" ;;
*)
  echo "usage: bash bench/eight_device.sh steady|live|pipeline" >&2; exit 2 ;;
esac
