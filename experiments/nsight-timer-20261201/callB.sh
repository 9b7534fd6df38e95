#!/usr/bin/env bash
# Call B: the serving study again (provenance with the PR #340 build recorded), the serving GPU test,
# then nsight-python's CUPTI timer beside the harness's.
set -uo pipefail
R=$PWD; mkdir -p .dg /tmp/pr340 /tmp/site
export PYTHONUNBUFFERED=1 DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=0
tar -xJf .scratch/r11/dg.tar.xz -C .dg && tar -xJf .scratch/r11/pr340-src.tar.xz -C /tmp/pr340
cp .scratch/r11/pr340_C.so /tmp/pr340/src/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so
export DSA_LAB_DEEPGEMM_PR340=/tmp/pr340/src
start=$(date +%s)
MAX_MINUTES=5 scripts/h200_serving.sh > $OUT/serving.log 2>&1; echo "serving rc=$? at $(( $(date +%s) - start )) s"
grep -E "^run |noisy" $OUT/serving.log
python3 -c "import json; e=json.load(open('$OUT/h200-serving/provenance.json'))['environment']; print({k: e[k] for k in e if 'deep' in k})"
PYTHONPATH=$R/.dg:$R timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_serving_step_gpu.py > $OUT/gpu-tests.log 2>&1; echo "gpu tests rc=$? at $(( $(date +%s) - start )) s"; tail -3 $OUT/gpu-tests.log
pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1; echo "pip rc=$?"
export NSPY_NCU_INIT_AT_IMPORT=0
PYTHONPATH=$R/.dg:$R:/tmp/site timeout $(( 570 - ($(date +%s) - start) )) python3 -m dsa_lab.cli profile --tool nsight --device cuda --preset h200-full \
  --backend deepgemm,triton,gluon --batch 1,128 --context 65536 --next-n 1,2,3,4,8 --strategy native,flatten,atom \
  --nsight-runs 5 --out $OUT/h200-nsight > $OUT/nsight.log 2>&1; echo "nsight rc=$? at $(( $(date +%s) - start )) s"
tail -25 $OUT/nsight.log | cut -c1-220
ls -la $OUT/h200-nsight 2>/dev/null | head
