#!/usr/bin/env bash
# The one driver for a GPU machine: the environment every benchmark needs, set up once
# (the wheels the image lacks from .whl/, PYTHONPATH, a JPEG set when JPEGS=N per class is
# given), then each command given, its output in $OUT/N.txt and the machine in $OUT/machine.txt.
#   bash bench/device.sh "python3 bench/compare.py --models resnet18 --gpus 1" "bash bench/smoke.sh"
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
# The built-in loop's folder under the name it installs as (pyproject's package-dir).
mkdir -p /tmp/site && ln -sfn "$PWD/trainer" /tmp/site/ddptui_trainer
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT
{ date -u; nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nproc
  python3 -c "import sys, torch, torchvision; print(sys.version.split()[0], torch.__version__, torchvision.__version__)"
} > "$OUT/machine.txt" 2>&1
if [ -n "${JPEGS:-}" ] && [ ! -e "/tmp/jpeg/.made-$JPEGS" ]; then  # a warm machine keeps it
  python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class "$JPEGS" > "$OUT/jpegs.txt" 2>&1 \
    && touch "/tmp/jpeg/.made-$JPEGS"
fi
n=0
for cmd in "$@"; do
  n=$((n + 1))
  echo "== $n: $cmd"
  timeout "${EACH_S:-580}" bash -c "$cmd" > "$OUT/$n.txt" 2>&1
  echo "exit $?" >> "$OUT/$n.txt"
  tail -n 25 "$OUT/$n.txt"
done
ps -eo pid,args | grep -E 'ddptui|trainer|torchrun' | grep -v -E 'grep|bench/device.sh' \
  || echo "no process left"
