#!/usr/bin/env bash
# Everything the Triton backend needs checked on a CUDA GPU, in one command that fits a 10-minute lease
# (TOTAL_S, default 560 s, caps the steps): the SASS counts of the launched kernels (benchmarks/sass_budget.py,
# compiled for this GPU's arch in the background), the backend's test file on CUDA tensors, `swiglu-ops
# verify` on both conversion paths, then benchmarks/bench_triton.py twice: first on the opt-in HW_CVT path
# (SWIGLU_OPS_TRITON_HW_CVT=1; conformance and timings, no compiled baselines), then on the default path
# (conformance at realistic sizes and > 2**31 elements, timings against the copy roofline at the README and
# MoE model shapes next to the issue model's prediction, the compiled reference). Extra arguments go to the
# default path's bench_triton.py (e.g. --tune; it needs a longer TOTAL_S). Logs and JSON go to $OUT
# (default: ./gpu-results); copy them into benchmarks/results/gpu/ afterwards.
set -o pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
TOTAL_S="${TOTAL_S:-560}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
left() { echo $((TOTAL_S - SECONDS)); }
# a step's timeout: its own limit, or what is left of TOTAL_S (15 s at least) if that is less
cap() { local l; l=$(left); if (( l < $1 )); then echo $(( l > 15 ? l : 15 )); else echo "$1"; fi; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.mem,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
# sm_90 (H100/H200) or sm_100 (B200): the issue models of sass_budget.py
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
case "$cap" in 100) arch=100 ;; *) arch=90 ;; esac
regex=$(python3 benchmarks/bench_triton.py --sass-regex)
timeout 180 python3 benchmarks/sass_budget.py --arch "$arch" --only "$regex" --workers 8 \
    --json "$OUT/sass_budget.json" >"$OUT/sass_budget.log" 2>&1 &
sass_pid=$!
# (the file took 125 s on an H100 with a cold kernel cache beside the SASS step)
timeout "$(cap "${PYTEST_TIMEOUT:-270}")" \
    python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/test_triton_backend.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -25 || status=1
timeout "$(cap 90)" python3 -m swiglu_ops verify --device cuda 2>&1 | tee "$OUT/verify.log" || status=1
SWIGLU_OPS_TRITON_HW_CVT=1 timeout "$(cap 90)" python3 -m swiglu_ops verify --device cuda 2>&1 \
    | tee "$OUT/verify_hw.log" || status=1
wait "$sass_pid" || echo "sass_budget.py failed (see $OUT/sass_budget.log): no predicted % unless benchmarks/results/sass_budget.json exists"
tail -3 "$OUT/sass_budget.log"
sass=()
[ -s "$OUT/sass_budget.json" ] && sass=(--sass "$OUT/sass_budget.json")
# the HW_CVT path's check and timings (no baselines), where the default path's bench still has 120 s after it
if (( $(left) >= 220 )); then
    hw_s=$(( $(left) / 3 ))
    (( hw_s < 100 )) && hw_s=100
    SWIGLU_OPS_TRITON_HW_CVT=1 timeout "$hw_s" python3 benchmarks/bench_triton.py --json "$OUT/bench_hw.json" \
        --no-baselines "${sass[@]}" 2>&1 | tee "$OUT/bench_hw.log" | grep -v "^\[.*tune" || status=1
else
    echo "run_gpu_checks: HW_CVT bench skipped ($(left) s of TOTAL_S left)" | tee "$OUT/bench_hw.log"
fi
bench_s=$(( $(left) - 5 ))
# the steps before overran: the bench still gets its checks and timings (worst case about 580 s in all)
(( bench_s < 120 )) && bench_s=120
timeout "$bench_s" python3 benchmarks/bench_triton.py --json "$OUT/bench.json" --budget $((bench_s - 90)) \
    "${sass[@]}" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^\[.*tune" || status=1
echo "run_gpu_checks: status $status after ${SECONDS} s; results in $OUT/ (copy them into benchmarks/results/gpu/)"
exit $status
