#!/usr/bin/env bash
# Device command for the Gluon kernel's first H200 call (issue 13): checks, the bench vs Triton and
# DeepGEMM, variant timing. Runs from the frozen copy .scratch/gluon/tree (HEAD + the Gluon files),
# DeepGEMM from .dg (carry [".scratch/gluon", ".dg"]). Everything lands in $OUT/gluon_h200.tgz.
set -uo pipefail
ROOT=$PWD
cd .scratch/gluon/tree
export PYTHONPATH="$ROOT/.dg:$PWD" PYTHONUNBUFFERED=1
export DSA_LAB_GIT_SHA="$(cat GIT_SHA)" DSA_LAB_GIT_DIRTY=1
W=/tmp/gw; rm -rf $W; mkdir -p $W
T0=$(date +%s); left() { echo $(( ${BUDGET:-270} - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, deep_gemm; print('torch', torch.__version__, 'triton', triton.__version__, 'deep_gemm', deep_gemm.__version__)"
  echo "git sha $DSA_LAB_GIT_SHA (+ uncommitted gluon_native.py, scripts/gluon_dev.py; frozen copy)"; } > $W/env.txt 2>&1
cat $W/env.txt
for attempt in 1 2; do
  timeout $(( $(left) > 100 ? 100 : $(left) )) python3 scripts/gluon_dev.py check --out $W/check.jsonl --case-timeout 40 >> $W/check.log 2>&1
  rc=$?; echo "check attempt $attempt rc=$rc t=$(( $(date +%s) - T0 ))s" | tee -a $W/check.log
  [ $rc -eq 3 ] || break
done
grep -c '"ok": true' $W/check.jsonl; grep -v '"ok": true' $W/check.jsonl | cut -c1-400
passing=$(python3 scripts/gluon_dev.py passing $W/check.jsonl); echo "passing next_n: [$passing]"
all="1,2,3,4,5,6,7,8"
rest=$(python3 -c "p=set('$passing'.split(',')); print(','.join(n for n in '$all'.split(',') if n not in p))")
bench() {  # name batch context next_n backends minutes
  [ -n "$4" ] || return 0
  local t=$(left); [ $t -gt 25 ] || { echo "skip bench $1: ${t}s left"; return 0; }
  timeout $(( t - 10 )) python3 -m dsa_lab.cli bench --preset h200-full --backend "$5" --strategy native,atom \
    --batch "$2" --context "$3" --next-n "$4" --out $W/"$1" --max-minutes "$6" --max-seconds-per-point 0.2 \
    --no-progress $7 >> $W/bench.log 2>&1
  echo "bench $1 rc=$? t=$(( $(date +%s) - T0 ))s" | tee -a $W/bench.log; tail -2 $W/bench.log
}
bench b128_l64k 128 64K "$passing" gluon,triton,deepgemm 2.2 --measure-ceilings
bench b64_l32k 64 32K "$passing" gluon,triton,deepgemm 1.2 ""
bench b128_l64k_rest 128 64K "$rest" triton,deepgemm 0.8 ""
bench b64_l32k_rest 64 32K "$rest" triton,deepgemm 0.6 ""
if [ $(left) -gt 40 ] && [ -n "$passing" ]; then
  timeout $(( $(left) - 8 )) python3 scripts/gluon_dev.py variants --out $W/variants.jsonl --seconds-per-point 0.2 \
    "3:rule|p=row;m=64;g=192|p=pad;m=256;g=256|p=pair;m=128;g=128" "1:rule|c=4;s=8|c=2;s=8" "4:rule|s=4|s=12" \
    "8:rule|m=128;g=128;l=72" > $W/variants.log 2>&1; echo "variants rc=$? t=$(( $(date +%s) - T0 ))s"; cat $W/variants.log | cut -c1-300
fi
python3 - <<'PY' 2>&1 | tee $W/summary.txt
import pandas as pd, glob
rows = []
for f in sorted(glob.glob('/tmp/gw/*/results.parquet')):
    d = pd.read_parquet(f); rows.append(d)
if rows:
    d = pd.concat(rows)
    cols = [c for c in ("backend","strategy","batch","context","next_n","status","median_ms","rel_iqr","rel_err","message") if c in d.columns]
    pd.set_option("display.width", 250); pd.set_option("display.max_rows", 300); pd.set_option("display.max_colwidth", 60)
    print(d[cols].sort_values(["batch","next_n","backend","strategy"]).to_string(index=False))
PY
cd /tmp && tar czf $OUT/gluon_h200.tgz gw && cp $W/summary.txt $W/check.log $OUT/ 2>/dev/null; ls -la $OUT; echo "total $(( $(date +%s) - T0 ))s"
