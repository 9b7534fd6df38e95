#!/usr/bin/env bash
# Call C: the serving study once more, brought back as one archive (a call returns at most 8 files).
set -uo pipefail
mkdir -p .dg /tmp/pr340
export PYTHONUNBUFFERED=1 DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=0
tar -xJf .scratch/r11/dg.tar.xz -C .dg && tar -xJf .scratch/r11/pr340-src.tar.xz -C /tmp/pr340
cp .scratch/r11/pr340_C.so /tmp/pr340/src/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so
export DSA_LAB_DEEPGEMM_PR340=/tmp/pr340/src
start=$(date +%s)
MAX_MINUTES=5 OUT=/tmp/serve scripts/h200_serving.sh > $OUT/serving.log 2>&1; echo "serving rc=$? at $(( $(date +%s) - start )) s"
grep -E "^run |noisy" $OUT/serving.log
tar -C /tmp/serve -czf $OUT/h200-serving.tar.gz h200-serving && ls -la $OUT
