#!/usr/bin/env bash
# The whole decode step as vLLM runs it (issue 26), on an SM90 device (H100 or H200), resumable across calls:
# the GPU tests of vLLM's top-k, the ragged-verification replay and the graph-replayed step, then
# `dsa-lab bench --preset step` (logits, then vLLM's top-k, B 1-256, both timers; ragged verification).
#
#   first call:  scripts/step_study.sh
#   next call:   scripts/step_study.sh PATH/TO/RUN       (the folder brought back, copied into the repo)
#   no tests:    SKIP_TESTS=1 scripts/step_study.sh ...
#
# Carry [".dg", "build/vllm_topk"]: DeepGEMM from the vLLM 0.33.0 wheel (see scripts/h200_sweep.sh) and vLLM's
# top-k built here by scripts/build_vllm_topk.py. The run goes to $OUT/<gpu>-step/ (gpu: h100 or h200, read off
# nvidia-smi) and is stopped cleanly after MAX_MINUTES (default 6); a later call resumes it. Set DSA_LAB_GIT_SHA
# and DSA_LAB_GIT_DIRTY to record the commit (the device copy has no .git). Exit status: the bench's.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.dg:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export DSA_LAB_VLLM_TOPK="${DSA_LAB_VLLM_TOPK:-$PWD/build/vllm_topk}"
OUT="${OUT:-$PWD/out}"
name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case "$name" in
    *H200*) gpu=h200 ;;
    *H100*) gpu=h100 ;;
    *) echo "step_study: an SM90 H100 or H200 is expected, this is '$name'" >&2; exit 2 ;;
esac
RUN="$OUT/${RUN_NAME:-$gpu-step}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/device.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout "${TEST_SECONDS:-240}" python3 -m pytest -q -p no:cacheprovider -k "not triton" tests/test_topk_gpu.py \
        tests/test_replay_gpu.py tests/test_serving_step_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15 || true
fi
args=(--preset step --device cuda --out "$RUN" --measure-ceilings --max-minutes "${MAX_MINUTES:-6}")
if [ $# -ge 1 ]; then
    [ -f "$1/provenance.json" ] || { echo "step_study: no provenance.json in $1: nothing to resume" >&2; exit 2; }
    mkdir -p "$RUN"
    for f in provenance.json points.jsonl results.parquet bench.log; do
        if [ -f "$1/$f" ]; then cp "$1/$f" "$RUN/$f"; fi
    done
    args+=(--resume)
fi
status=0
python3 -m dsa_lab.cli bench "${args[@]}" 2>&1 | tee -a "$RUN.log" | tail -40 || status=$?
mkdir -p "$RUN" && cat "$RUN.log" >> "$RUN/bench.log" && rm -f "$RUN.log"
echo "step_study: bench exit status $status; run folder $RUN"
exit "$status"
