#!/usr/bin/env bash
# One device call (nvidia-h200-x2) for issue 12: GPU memory beside nvidia-smi (idle and in a run),
# a SIGSTOPped rank inside NCCL collectives (flag, stacks, k -> next step on 1 GPU), the dashboard
# in tmux with a stalled rank and q, then the elastic table and the plain-script ratio again.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
REPO=$PWD
R18="resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256"
left() { ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep || echo "no process left"; }
{ echo "## idle"; nvidia-smi --query-gpu=index,memory.used --format=csv; python3 -m ddptui gpus; } \
    > "$OUT/memory-idle.txt" 2>&1
( cd /tmp && timeout 240 python3 "$REPO/bench/stall.py" $R18 --steps-per-epoch 500 \
    --out "$OUT/stall.json" --log /tmp/stall.jsonl ) > "$OUT/stall.md" 2>&1
left >> "$OUT/stall.md"
# The dashboard: SIGSTOP rank 1, capture the screen once it is flagged, then q.
cd /tmp && tmux new-session -d -x 160 -y 50 "cd /tmp && python3 -m ddptui run $R18 --epochs 100 \
    --stall-after 5 --checkpoint-dir /tmp/ck --log /tmp/tui.jsonl; echo EXIT \$? > /tmp/tui.exit"
for i in $(seq 60); do grep -q '"kind":"step"' /tmp/tui.jsonl 2>/dev/null && break; sleep 1; done
sleep 15
victim=$(python3 -c "import json; print([e for e in map(json.loads, open('/tmp/tui.jsonl')) if e['kind']=='rank' and e['rank']==1 and e.get('pid')][-1]['pid'])")
kill -STOP "$victim"; date +%s.%N > /tmp/stopped_at
sleep 14; tmux capture-pane -p > "$OUT/dashboard-stalled-h200x2.txt"
date +%s.%N > /tmp/q_at; tmux send-keys q; sleep 1; tmux send-keys y
for i in $(seq 60); do [ -f /tmp/tui.exit ] && break; sleep 0.2; done
python3 - >> "$OUT/dashboard-stalled-h200x2.txt" <<'PY'
import json, os
q = float(open("/tmp/q_at").read()); ex = os.path.getmtime("/tmp/tui.exit")
print("exit", open("/tmp/tui.exit").read().strip(), f"q -> exit {ex - q:.2f} s")
evs = [json.loads(l) for l in open("/tmp/tui.jsonl")]
for e in evs:
    if e["kind"] in ("rank", "checkpoint") or (e["kind"] == "message" and e.get("level") != "info"):
        print(round(e["t"] - q, 2), {k: v for k, v in e.items() if k not in ("t", "stacks")})
PY
left >> "$OUT/dashboard-stalled-h200x2.txt"
cd "$REPO"
( cd /tmp && timeout 200 python3 "$REPO/bench/elastic.py" $R18 --steps-per-epoch 500 \
    --out "$OUT/elastic.json" --log /tmp/el.jsonl ) > "$OUT/elastic.md" 2>&1
left >> "$OUT/elastic.md"
timeout 200 python3 bench/compare.py --models resnet18 --gpus 2 --out "$OUT/compare.json" \
    > "$OUT/compare.md" 2>&1
grep -h -B2 -A12 -E 'Traceback' /tmp/*.rank*.out 2>/dev/null | head -60 > "$OUT/tracebacks.txt"
# The JPEG path after the trainer/ regrouping: workers from the fork server, GPU decode.
python3 bench/make_jpegs.py /tmp/jpeg --classes 4 --per-class 500 > /dev/null 2>&1
( cd /tmp && timeout 150 python3 -m ddptui run resnet18 --gpus 0,1 --data imagefolder:/tmp/jpeg \
    --decode gpu --epochs 2 --amp bf16 --channels-last --batch-size 128 --headless \
    --log /tmp/jpeg.jsonl ) > "$OUT/jpeg-decode-gpu.txt" 2>&1
echo "exit $?" >> "$OUT/jpeg-decode-gpu.txt"; left >> "$OUT/jpeg-decode-gpu.txt"
