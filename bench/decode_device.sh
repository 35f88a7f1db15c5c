#!/usr/bin/env bash
# One device call (one GPU): the JPEG pipeline's codecs against the synthetic-data rate of the
# same model on the same GPU (issue 14 part 1). Wheels: textual's, nvidia-nvimgcodec-cu13,
# nvidia-nvjpeg in .whl/ (installed by the caller into /tmp/site).
# Usage on the device: bash bench/decode_device.sh [GPUS]   (GPUS: 0 or 0,1)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export PYTHONPATH=/tmp/site:$PWD
GPUS=${1:-0}
R="$OUT/decode.txt"
nvidia-smi -L > "$R"; nproc >> "$R"
python3 -c "import nvidia.nvimgcodec as n; print('nvimgcodec', n.__version__)" 2>&1 | tail -1 >> "$R"
t=$(date +%s); python3 bench/make_jpegs.py /tmp/jpeg --classes 10 --per-class 3000 >> "$R" 2>&1
echo "jpegs made in $(( $(date +%s) - t )) s" >> "$R"
timeout 150 python3 bench/decode_probe.py /tmp/jpeg --batches 16 >> "$R" 2>"$OUT/probe.err"
P="python3 bench/pipeline.py /tmp/jpeg --gpus $GPUS --batch-size 256 --"
S="python3 bench/pipeline.py synthetic --gpus $GPUS --batch-size 256 -- --steps-per-epoch 250 --epochs 1"
A="--amp bf16 --channels-last --epochs 2"
{
  timeout 120 $S --amp bf16 --channels-last
  timeout 120 $P $A --decode cpu
  timeout 120 $P $A --decode gpu
  DDPTUI_DECODER=nvimgcodec timeout 120 $P $A --decode gpu
  DDPTUI_DECODER=nvimgcodec DDPTUI_NVIMGCODEC=all timeout 120 $P $A --decode gpu
  DDPTUI_DECODER=nvimgcodec DDPTUI_NVIMGCODEC=hw,whole timeout 120 $P $A --decode gpu
  timeout 120 $P $A --decode gpu
  timeout 120 $S --amp bf16 --channels-last
} >> "$R" 2>&1
cat "$R"
