#!/usr/bin/env bash
# The first thing to run on a machine with a CUDA device (at most 8 minutes on one H100):
#   bash bench/gpu_check.sh [--sections ...] [--budget-s 480] [--out FILE] [--dry] [--plumbing]
# the gpu-marked tests, the gpt and llama recipes at about 0.7-0.8B parameters beside a hand-written
# loop (tokens/s, MFU), fp16 loss scaling, FSDP CPU offload, the memory estimate against the measured
# peak, host syncs per quiet step; the results in bench/results/gpu_check.json (bench/gpu_check.py
# says what each section does). Without CUDA: a dry run at tiny sizes on the CPU that exits 0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
if ! "$python" -c "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA: bench/gpu_check.sh runs dry (tiny CPU runs of its own code paths; nothing measured)"
fi
exec "$python" "$here/gpu_check.py" "$@"
