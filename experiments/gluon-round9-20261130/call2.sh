#!/usr/bin/env bash
# Round 9, call 2: ring depth variants with the per-request ctx read; same-process sweep at B=128, L=64K; ncu at n=2, 4.
set -uo pipefail
R=$PWD
W=$OUT/work; mkdir -p $W
export PYTHONUNBUFFERED=1 PYTHONPATH=$R/.dg:$R DSA_LAB_DEEPGEMM_PR340=$R/.pr340/src
export DSA_LAB_GIT_SHA=${SHA:-unknown} DSA_LAB_GIT_DIRTY=1
ln -sfn $R/.dg/deep_gemm/include/cute .pr340/src/deep_gemm/include/cute
ln -sfn $R/.dg/deep_gemm/include/cutlass .pr340/src/deep_gemm/include/cutlass
timeout 200 python3 scripts/gluon_dev.py variants --out $W/variants.jsonl \
  "2:rule|c=3;s=15|c=3;s=18" "4:rule|s=12|s=16|s=20" "1:rule|s=15" "3:rule|s=12|s=16" "8:rule|s=12" > $W/variants.log 2>&1; echo "variants rc=$?"
cut -c1-200 $W/variants.log
timeout 170 python3 -m dsa_lab.cli bench --preset h200-full --device cuda --out $W/b128 \
  --backend deepgemm,deepgemm-pr340,gluon --batch 128 --context 64K --next-n 1,2,3,4,5,6,7,8 --strategy native,atom \
  --max-minutes 2.5 > $W/b128.log 2>&1; echo "bench rc=$?"
tail -12 $W/b128.log
for n in 2 4; do
  timeout 90 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -o $W/ncu-n$n \
    python3 .scratch/r9/ncu_driver.py $n > $W/ncu-n$n.log 2>&1; echo "ncu n=$n rc=$?"
  ncu -i $W/ncu-n$n.ncu-rep --page details --csv > $W/ncu-n$n-details.csv 2>&1
done
cd $OUT && tar czf call2.tar.gz work && rm -rf work && ls -la $OUT
