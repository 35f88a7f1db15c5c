#!/usr/bin/env bash
# One device call (nvidia-h200-x2), sessions 7-10: the 2-GPU baselines of issue 14 parts 1, 2 and 5.
# Imports and their bytecode cache, launch -> first step, the join through the dashboard and
# through the API, bench/overlap_probe.py on GPU 0, the JPEG pipeline against synthetic data, and
# (share) --decode gpu with SHARES of each batch decoded by the workers, (cpu) --decode cpu with
# this tree's trainer against the one extracted to OLD, alternating; (queues, baselines) session
# 10's hardware queues per stream; (depth) the decode thread further ahead; (final) this tree
# against OLD. Results in $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; FINAL=$OUT; OUT=/tmp/r3; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
REPO=$PWD
jpegs() { [ -d /tmp/jpeg ] || python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class ${PER_CLASS:-3000} > /dev/null 2>&1; }
# bench/pipeline.py on GPUS (both by default), resnet18 bf16 channels_last bs 256: append the data and options
PIPE="python3 bench/pipeline.py --gpus ${GPUS:-0,1} --batch-size 256"
S="$PIPE synthetic -- --steps-per-epoch 150 --epochs 1 --amp bf16 --channels-last"  # the same model, no input
J="$PIPE /tmp/jpeg -- --amp bf16 --channels-last --epochs 3"  # the JPEG set: add --decode ...
PARTS=${PARTS:-"imports launch join overlap"}
for part in $PARTS; do case $part in
imports) {
  python3 -c "import sys, torch, os; d=os.path.dirname(torch.__file__); print(sys.version); print(d, 'writable' if os.access(d, os.W_OK) else 'read-only'); print('pyc in torch/__pycache__:', len(os.listdir(os.path.join(d, '__pycache__'))) if os.path.isdir(os.path.join(d, '__pycache__')) else 'none')"
  env | grep -E '^PYTHON' || true
  for i in 1 2; do python3 -c "import time; t=time.time(); import torch; a=time.time(); import torchvision; print('torch', round(a-t,2), 'torchvision', round(time.time()-a,2))"; done
  python3 -X importtime -c "import torch, torchvision" 2> /tmp/imp.txt; sort -t'|' -k2 -n -r /tmp/imp.txt | head -12
} > "$OUT/imports.txt" 2>&1 ;;
launch)  # off: DDPTUI_PYCACHE=0 (bytecode compiled at every start where it is not written)
  for i in ${LAUNCHES:-on1 on2 on3 off1 off2}; do
    rm -f /tmp/run.jsonl; T=$(date +%s.%N)
    ( cd /tmp && DDPTUI_PYCACHE=$([ "${i%?}" = off ] && echo 0 || echo "") timeout 120 python3 -m ddptui run \
        resnet18 --gpus 0,1 --headless --data synthetic --amp bf16 --channels-last --epochs 1 \
        --steps-per-epoch 20 --log /tmp/run.jsonl > /tmp/run.out 2>&1 )
    cp /tmp/run.jsonl "$OUT/launch_$i.jsonl"; echo "$T" > "$OUT/launch_$i.t0"
  done
  T=$(date +%s.%N); BENCH_T0=$T timeout 120 python3 -m torch.distributed.run --standalone \
      --nproc-per-node 2 bench/launch_phases.py > "$OUT/launch_plain.txt" 2>&1 ;;
join)  # bench/join_device.sh, with NCCL's own init timings in the ranks' output
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT ROUNDS=3 TREES=new OUT=$OUT bash bench/join_device.sh \
      > "$OUT/join.txt" 2>&1
  grep -h -E "Init timings|Init COMPLETE|ncclCommInitRank" "$OUT"/run*/el.rank*.out \
      > "$OUT/nccl_init.txt" 2>&1 ;;
overlap)
  jpegs
  CUDA_VISIBLE_DEVICES=${GPU:-0} timeout 240 python3 bench/overlap_probe.py /tmp/jpeg --steps 40 \
      ${VARIANTS:+--variants $VARIANTS} ${TRACE:+--trace "$OUT/trace.json" --trace-variant $TRACE} \
      > "$OUT/overlap.txt" 2>&1 ;;
pipeline)  # part 1 on 2 GPUs: synthetic, the plain loader, --decode gpu with each decoder
  jpegs
  S7="$PIPE synthetic -- --steps-per-epoch 250 --epochs 1 --amp bf16 --channels-last"
  P7="$PIPE /tmp/jpeg -- --amp bf16 --channels-last --epochs 2 --decode gpu"
  {
    timeout 90 $S7
    timeout 80 $P7
    DDPTUI_DECODER=engines timeout 80 $P7
    timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/plain_jpeg.py \
        /tmp/jpeg --workers 12 --batch-size 256
    timeout 80 $P7
    DDPTUI_DECODER=engines timeout 80 $P7
  } > "$OUT/pipeline.txt" 2>&1 ;;
share)  # part 1 on 2 GPUs: --cpu-decode-share F for each F in SHARES (eF: DDPTUI_DECODER=engines), synthetic first and last
  jpegs
  P="$J --decode gpu"
  {
    timeout 90 $S
    for f in ${SHARES:-0 0.3 0.5}; do
      case $f in e*) DDPTUI_DECODER=engines timeout 100 $P --cpu-decode-share "${f#e}" ${WORKERS:-} ;;
                 *) timeout 100 $P --cpu-decode-share "$f" ${WORKERS:-} ;; esac
    done
    timeout 90 $S
  } > "$OUT/share.txt" 2>&1 ;;
cpu)  # --decode cpu, this tree against OLD (git archive REV trainer | tar -x -C OLD), alternating
  jpegs
  P="$J --decode cpu"
  {
    lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)"
    for tree in ${CPU_TREES:-new old new old}; do
      echo "== $tree"
      PYTHONPATH=$([ "$tree" = old ] && echo "$OLD:")$PYTHONPATH timeout 100 $P ${WORKERS:-}
    done
  } > "$OUT/cpu.txt" 2>&1 ;;
queues)  # session 10: one hardware queue per stream (ddptui's default now) against CUDA's 8
  jpegs
  P=$J
  {
    for c in 32 8 32 8; do
      echo "== CUDA_DEVICE_MAX_CONNECTIONS=$c"
      CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 90 $S
      CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 100 $P --decode gpu
    done
    for f in ${SHARES:-0.25}; do echo "== share $f"; timeout 100 $P --decode gpu --cpu-decode-share "$f"; done
  } > "$OUT/queues.txt" 2>&1 ;;
baselines)  # session 10: --decode cpu with 32 and 8 queues, the plain JPEG loader, ddptui vs plain on synthetic
  jpegs
  P="$J --decode cpu"
  {
    for c in 32 8; do echo "== --decode cpu, CUDA_DEVICE_MAX_CONNECTIONS=$c"; CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 100 $P; done
    echo "== plain loader"
    timeout 150 torchrun --standalone --nproc-per-node 2 bench/plain_jpeg.py /tmp/jpeg --workers 12 \
        --batch-size 256 --epochs 3 2>&1 | grep img_s
    timeout 200 python3 bench/compare.py --models resnet18 --gpus 2 --steps 200 --warmup 40
  } > "$OUT/baselines.txt" 2>&1 ;;
depth)  # session 10: --decode gpu with the decode thread 2 (this tree) or 4 (deep) batches ahead,
  # 12 and 6 workers, alternating
  jpegs
  rm -rf /tmp/alt && mkdir -p /tmp/alt && cp -r trainer /tmp/alt/
  sed -i 's/threaded_batches(self.train, self.me.device, self.prepare)$/threaded_batches(self.train, self.me.device, self.prepare, depth=4)/' \
      /tmp/alt/trainer/pipeline/loaders.py
  P="$J --decode gpu"
  {
    grep -n "depth=4" /tmp/alt/trainer/pipeline/loaders.py
    timeout 90 $S
    for rep in 1 2; do for tree in new deep; do for w in 12 6; do
      echo "== $tree, $w workers"
      PYTHONPATH=$([ $tree = deep ] && echo /tmp/alt:)$PYTHONPATH timeout 100 $P --workers $w
    done; done; done
    timeout 90 $S
  } > "$OUT/depth.txt" 2>&1 ;;
final)  # session 10: --decode gpu, this tree against OLD, alternating, synthetic first and last
  jpegs
  P="$J --decode gpu"
  {
    timeout 90 $S
    for tree in ${TREES:-new old new old new}; do
      echo "== $tree"
      PYTHONPATH=$([ "$tree" = old ] && echo "$OLD:")$PYTHONPATH timeout 100 $P
    done
    timeout 90 $S
  } > "$OUT/final.txt" 2>&1 ;;
esac; done
DDPTUI_PYCACHE="" ls "$HOME/.cache/ddptui/pycache" > /dev/null 2>&1 && du -sh "$HOME/.cache/ddptui/pycache" > "$OUT/pycache.txt"
tar -czf "$FINAL/results.tgz" -C "$OUT" .
cat "$OUT"/*.txt "$OUT"/*.md 2>/dev/null
