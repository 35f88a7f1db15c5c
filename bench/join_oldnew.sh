#!/usr/bin/env bash
# Issue 14 part 2 on nvidia-h200-x2: the join through the dashboard (3 rounds) with this tree,
# then bench/elastic.py alternating the trainer of an older tree (OLD, default _old: extracted
# with `git archive REV trainer | tar -x -C _old`) and this one. Results in $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
REPO=$PWD; OLD=${OLD:-$PWD/_old}; SITE=/tmp/site
( cd /tmp && PYTHONPATH=$SITE:$REPO timeout 240 python3 "$REPO/bench/join_tmux.py" resnet18 --gpus 0,1 \
    --data synthetic --amp bf16 --channels-last --batch-size 256 --rounds 3 --keep "$OUT" ) \
    > "$OUT/join_tmux.txt" 2>&1
for tree in old new old new; do
  path=$REPO; [ $tree = old ] && path=$OLD:$REPO
  ( cd /tmp && PYTHONPATH=$SITE:$path timeout 200 python3 "$REPO/bench/elastic.py" resnet18 --gpus 0,1 \
      --data synthetic --amp bf16 --channels-last --batch-size 256 --steps-per-epoch 500 \
      --out "$OUT/elastic_$tree.json" --log /tmp/el.jsonl ) >> "$OUT/elastic_$tree.md" 2>&1
  grep -h "first step on" /tmp/el.jsonl >> "$OUT/phases_$tree.jsonl"
done
ps -eo pid,args | grep -E 'ddptui|trainer|multiprocessing' | grep -v grep > "$OUT/left.txt"
cat "$OUT/join_tmux.txt"; grep -h "^| [rks]" "$OUT"/elastic_*.md
