#!/usr/bin/env bash
# Everything the Triton backend needs checked on a CUDA GPU, in one go (for a short lease on a lent GPU):
# the backend's test file on CUDA tensors, `swiglu-ops verify`, then benchmarks/bench_triton.py
# (conformance at realistic sizes and > 2**31 elements, timings against the copy roofline, launch
# configuration variants, the compiled reference). Logs and JSON go to $OUT (default: ./gpu-results).
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
python3 -c "import torch, triton, numba; print('torch', torch.__version__, 'triton', triton.__version__, 'numba', numba.__version__)"
status=0
timeout "${PYTEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider tests/test_triton_backend.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -25 || status=1
python3 -m swiglu_ops verify --device cuda 2>&1 | tee "$OUT/verify.log" || status=1
timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_triton.py --json "$OUT/bench.json" "$@" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^\[.*tune" || status=1
exit $status
