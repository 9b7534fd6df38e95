#!/usr/bin/env bash
# Serving study, call A: PR #340 from its prebuilt stripped extension, then h200-serving (resumable).
set -uo pipefail
R=$PWD; mkdir -p .dg /tmp/pr340
export PYTHONUNBUFFERED=1 DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=0
tar -xJf .scratch/r11/dg.tar.xz -C .dg && tar -xJf .scratch/r11/pr340-src.tar.xz -C /tmp/pr340
cp .scratch/r11/pr340_C.so /tmp/pr340/src/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so
export DSA_LAB_DEEPGEMM_PR340=/tmp/pr340/src
PYTHONPATH=$R/.dg:$R python3 -c "import deep_gemm; print('dg ok')"
PYTHONPATH=/tmp/pr340/src python3 -c "import deep_gemm, torch; print('pr340', deep_gemm.__file__, hasattr(deep_gemm,'fp8_paged_mqa_logits'))"
MAX_MINUTES=${MAX_MINUTES:-8.2} scripts/h200_serving.sh ${PREV:-} > $OUT/serving.log 2>&1; echo "serving rc=$?"
tail -40 $OUT/serving.log | cut -c1-220
ls -la $OUT $OUT/h200-serving
