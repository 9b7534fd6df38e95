#!/usr/bin/env bash
# Profile native vs flatten vs atom on the H200: torch.profiler tables + one Chrome trace per
# backend, and Nsight Compute counters (CLI, kernel replay, logits kernels only).
#
#   OUT=/some/folder bash scripts/h200_profile.sh        # on the device machine, from the repo root
#
# Expected: about 6 minutes (torch.profiler <= 2 min, ncu <= 100 s per backend, start-up), more
# if DeepGEMM's JIT cache is cold. Configurations cut by a budget are recorded as skipped.
# Grid (the harness's grammar, as `dsa-lab bench` takes it): backends deepgemm and triton (a
# backend that is missing or unavailable is recorded with its reason and skipped), B in {128, 64},
# L = 64K, next_n in {4, 2, 8, 1, 3} (most telling first, so a time limit cuts the least useful
# points), strategies native, flatten, atom (an atom plan of one native piece is skipped).
# Every point is checked against the reference before it is profiled.
# Writes two files, whatever the number of backends (the device copies back a few files only):
#   $OUT/log.txt             everything printed, ncu's choice of path included
#   $OUT/profile.tar.gz      the folder profile/:
#     provenance.json          store-format provenance + every config's status/reason
#     torch_kernels.parquet    torch.profiler: (config, phase, kernel, grid) rows
#     torch_phases.parquet     torch.profiler: (config, phase) rows
#     ncu_kernels.parquet      ncu: one row per logits kernel, config attached
#     ncu_raw.txt.gz           ncu's own output, to re-parse
#     trace_<backend>.json.gz  B=128, n=4: a native step then a flatten step
#     ncu_<backend>.ncu-rep    the Nsight Compute reports, for the GUI
# Afterwards: tar xzf profile.tar.gz, then move profile/ to data/h200/profiles/<run_id>/ (run_id is
# in profile/provenance.json).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder whose files come back}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/.dg:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
BACKENDS="${BACKENDS:-deepgemm,triton}"
TORCH_BUDGET="${TORCH_BUDGET:-120}"  # seconds: torch.profiler starts no configuration after this
NCU_TIMEOUT="${NCU_TIMEOUT:-100}"    # seconds per backend's ncu run (its target stops 45 s earlier)
TOTAL_TIMEOUT="${TOTAL_TIMEOUT:-420}"  # last-resort guard; tables are written after each stage
mkdir -p "$OUT"
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1)"
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  timeout --signal=INT "$TOTAL_TIMEOUT" "$PY" -m dsa_lab.profiling --tool torch,ncu --preset h200-full \
    --backend "$BACKENDS" --strategy all --batch 128,64 --context 64K --next-n 4,2,8,1,3 \
    --repeats 1 --torch-budget "$TORCH_BUDGET" --ncu-timeout "$NCU_TIMEOUT" --out "$OUT/profile"
  echo "== dsa_lab.profiling exit $?"
} 2>&1 | tee "$OUT/log.txt"
if [ -d "$OUT/profile" ]; then
  tar czf "$OUT/profile.tar.gz" -C "$OUT" profile && rm -rf "$OUT/profile"
fi
