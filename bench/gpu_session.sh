#!/usr/bin/env bash
# One device command's worth of GPU measurements, most valuable first, each run resumable.
#
#   bash bench/gpu_session.sh [SECONDS]     (repository root, on the CUDA machine; default 540 s)
#
# Wheels under .whl/ (bitsandbytes, deepspeed and theirs: bench/README.md) are installed first when
# present. Each step gets what is left of the budget and stops cleanly at it; results are written
# after every row, so the same command run again goes on where the last one stopped (--resume).
# With the project's device tool, $OUT is where the results must land to come back; elsewhere they
# stay in bench/results.
set -u
budget_seconds=${1:-540}
end=$((SECONDS + budget_seconds))
out_dir=${OUT:-bench/results}
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

step() {
    local left=$((end - SECONDS))
    if [ "$left" -lt 60 ]; then
        echo "skipped (budget spent): $*"
        return 0
    fi
    echo "== $* (${left} s left)"
    timeout --signal=INT "$left" python3 "$@"
}

# 1. The fit verdict's own figure on the shapes of the one published OOM the model still calls fitting.
step bench/cuda_memory.py --resume --least-capacity --only "llama2-70b-8l"
# 2. The quick rows with their least capacity: one per method, the SGD row and FSDP CPU offload.
step bench/cuda_memory.py --resume --least-capacity --quick
# 3. Step times of the same rows.
step bench/cuda_speed.py --resume --quick
# 4. The rest of the grids, as far as the budget goes.
step bench/cuda_memory.py --resume
step bench/cuda_speed.py --resume

if [ "$out_dir" != bench/results ]; then
    cp bench/results/cuda_*.json bench/results/cuda_*.md "$out_dir"/ 2>/dev/null || true
fi
ls -l bench/results/cuda_* 2>/dev/null || echo "no results written"
