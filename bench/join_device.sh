#!/usr/bin/env bash
# Issue 14 part 2 on nvidia-h200-x2: joins timed from the ranks' own events. ROUNDS (default 0)
# rounds through the dashboard in tmux (bench/join_tmux.py), then bench/elastic.py once per word
# of TREES: "new" runs this tree's trainer, "old" the one extracted to OLD (default _old:
# `git archive REV trainer | tar -x -C _old`). Each run keeps its event log and rank output.
#   TREES="old new old new" ROUNDS=3 bash bench/join_device.sh    (session 8, call 4)
#   TREES="new new new" bash bench/join_device.sh                 (calls 5 and 6)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
REPO=$PWD; OLD=${OLD:-$PWD/_old}; SITE=/tmp/site; OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${ROUNDS:-0}" -gt 0 ]; then
  ( cd /tmp && PYTHONPATH=$SITE:$REPO timeout 240 python3 "$REPO/bench/join_tmux.py" resnet18 \
      --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256 --rounds "$ROUNDS" \
      --keep "$OUT" ) > "$OUT/join_tmux.txt" 2>&1
fi
i=0
for tree in ${TREES:-new}; do
  i=$((i + 1)); path=$REPO; [ "$tree" = old ] && path=$OLD:$REPO
  rm -f /tmp/el.*
  ( cd /tmp && PYTHONPATH=$SITE:$path timeout "${LIMIT:-150}" python3 "$REPO/bench/elastic.py" \
      resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last --batch-size 256 \
      --steps-per-epoch 500 --out "$OUT/elastic$i.json" --log /tmp/el.jsonl ) > "$OUT/elastic$i.md" 2>&1
  echo "run $i ($tree) exit $?" >> "$OUT/elastic$i.md"
  mkdir -p "$OUT/run$i"; cp /tmp/el.* "$OUT/run$i/" 2>/dev/null
  ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep >> "$OUT/elastic$i.md"
  pkill -9 -f 'trainer|multiprocessing' 2>/dev/null; sleep 1
done
cat "$OUT/join_tmux.txt" 2>/dev/null; grep -h "^| [rks]\|exit" "$OUT"/elastic*.md
