#!/usr/bin/env bash
# The H200 sweep in one command, for the device machine (resumable across calls).
#
#   first call:   scripts/h200_sweep.sh [BENCH FLAGS...]
#   next call:    scripts/h200_sweep.sh PATH/TO/h200-full [BENCH FLAGS...]   (the folder brought back last
#                                                            time, copied into the repo so it travels)
#   a subset:     RUN_NAME=h200-subset scripts/h200_sweep.sh --batch 64,128 --context 32K,64K --next-n 1,2,3,4,8
#
# Measures the ceilings (4 GiB read, 8192^3 FP8 _scaled_mm) into the run's provenance, then runs
# `dsa-lab bench --preset h200-full` (plus any BENCH FLAGS: the harness's grammar, comma-separated lists)
# into $OUT/$RUN_NAME/ and stops cleanly after MAX_MINUTES (default 7.5; held even inside a point) so the
# call ends inside its 10-minute limit. What comes back (<= 8 files, 1 folder deep):
# $OUT/$RUN_NAME/{results.parquet, provenance.json, points.jsonl, bench.log}.
# DeepGEMM comes from .dg/ (carry [".dg"]): the vllm 0.33.0 wheel's vllm/third_party/deep_gemm/ unzipped
# into .dg/deep_gemm (git-ignored), its _C_extension.abi3.so stripped of debug info (`strip
# --strip-unneeded`: 29.5 MB to 1.8 MB, the code unchanged) so that .dg and the tree fit the device's
# 64 MiB carry. Set DSA_LAB_GIT_SHA / DSA_LAB_GIT_DIRTY to record the commit, since the device copy
# has no .git. Exit status: the bench's (130 if interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.dg:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/out}"
RUN="$OUT/${RUN_NAME:-h200-full}"
LOG="$OUT/bench.log.partial"
PRESET="${PRESET:-h200-full}"
args=(--preset "$PRESET" --device cuda --out "$RUN" --measure-ceilings --max-minutes "${MAX_MINUTES:-7.5}")

mkdir -p "$OUT"
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    previous="$1"
    shift
    [ -f "$previous/provenance.json" ] || { echo "no provenance.json in $previous: nothing to resume" >&2; exit 2; }
    mkdir -p "$RUN"
    for f in provenance.json points.jsonl results.parquet bench.log; do
        if [ -f "$previous/$f" ]; then cp "$previous/$f" "$RUN/$f"; fi
    done
    args+=(--resume)
fi
args+=("$@")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$LOG" || true
python3 -c "import deep_gemm, torch; print('deep_gemm', deep_gemm.__version__, 'torch', torch.__version__)" 2>&1 | tee -a "$LOG" || true
status=0
python3 -m dsa_lab.cli bench "${args[@]}" 2>&1 | tee -a "$LOG" || status=$?
mkdir -p "$RUN"
cat "$LOG" >> "$RUN/bench.log" && rm -f "$LOG"
echo "${0##*/}: bench exit status $status; run folder $RUN"
exit "$status"
