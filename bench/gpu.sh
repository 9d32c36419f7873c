#!/usr/bin/env bash
# The one prepared run of a GPU session (never part of CI):
#   1. the kernel tests on CUDA (compiled Triton kernels vs their torch twins, TF32 tolerance);
#   2. the GPU-only tests: compiled kernels inside the model, decode steps replayed from CUDA graphs
#      (tests/test_decode_graphs.py, and a stack with DAYZERO_DECODE_GRAPHS=1), the CUDA IPC handoff
#      between two processes, the whole pipeline with weights and pools on the GPU;
#   3. bench/kernel_builds.py: each kernel's shared memory under this host's Triton;
#   4. bench/handoff.py over CUDA IPC: decode's import of prefill's state vs a device copy (issue 16);
#   5. bench/attention.py: a CSA decode step (indexer + sparse attention) vs dense at 4k and 64k,
#      1 and 32 sequences a step;
#   6. bench/decode_launches.py: a decode step's kernel launches, wall and device-busy time, and
#      the same steps replayed from CUDA graphs (--graphs);
#   7. bench/kernels.py: compiled kernels vs twins at DeepSeek-V4-Flash shapes.
# Each step's time limit keeps the whole under the device tool's 10 minutes (first run: ~2).
# First run bench/gpu_wheels.sh here; then the device tool: carry [".whl"], command
# `bash bench/gpu.sh`. Logs land in $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/dayzero-gpu}
mkdir -p "$out"
# torch without CUDA would pass every step below (each bench says it needs a GPU and exits 0, the GPU
# tests skip): a session that measured nothing would read as a success
python3 -c "import sys, torch; torch.cuda.is_available() or sys.exit(f'bench/gpu.sh: this host\'s torch \
{torch.__version__} (CUDA build: {torch.version.cuda}) sees no CUDA GPU: nothing to measure')" 2>&1 |
  tee "$out/gpu.log" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  exit 1
export PYTHONPATH=$PWD/shared:$PWD:/tmp/site PYTHONUNBUFFERED=1 DAYZERO_CACHE_DIR=/tmp/dayzero-cache
unset TRITON_INTERPRET
status=0
python3 -c "import torch, triton, transformers as t; print(torch.__version__, triton.__version__, t.__version__,
torch.cuda.get_device_name())" 2>&1 | tee -a "$out/gpu.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$out/gpu.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider --timeout 90 -rfE tests/kernels tests/test_forward.py \
  tests/test_decode_graphs.py tests/services/test_handoff_transports.py tests/services/test_gpu_pipeline.py 2>&1 | tee -a "$out/gpu.log" ||
  status=1
# the kernels' shared memory as this host's Triton compiles them (CI checks them under 3.9)
(cd bench && timeout 45 python3 kernel_builds.py) 2>&1 | tee "$out/builds.md" || status=1
# the short measurement first: the device tool ends a command at 10 minutes
(cd bench && timeout 90 python3 handoff.py --transport cuda_ipc --profile) 2>&1 | tee "$out/handoff.md" || status=1
for batch in 1 32; do  # batch 1 is bound by kernel launches on a GPU; 32 is a serving batch
  (cd bench && timeout 50 python3 attention.py --parts decode --device cuda --backend triton --dtype bfloat16 \
    --contexts 4096,65536 --quick --batch $batch) 2>&1 | tee -a "$out/attention.md" || status=1
done
(cd bench && timeout 70 python3 decode_launches.py --device cuda --backend triton --batch 1,32 --graphs) 2>&1 |
  tee "$out/launches.md" || status=1
(cd bench && timeout 75 python3 kernels.py) 2>&1 | tee "$out/kernels.md" || status=1
exit $status
