#!/usr/bin/env bash
# The study's sweep on an SM100 GPU (B200, GB200): scripts/h200_sweep.sh with `--preset sm100`.
#
#   first call:   scripts/sm100_sweep.sh [BENCH FLAGS...]
#   next call:    scripts/sm100_sweep.sh PATH/TO/sm100-full [BENCH FLAGS...]
#
# Same grid as h200-full (B in {1, 16, 64, 128}; L in {8K, 32K, 64K, 128K, mixed:1K-64K};
# next_n in {1, 2, 3, 4, 5, 6, 8}; DeepGEMM and Triton; native, flatten, atom). On SM100 DeepGEMM runs
# any next_n natively (its varlen form), as our Triton kernel does, so every atom plan is one native
# piece and is recorded as skipped ("the same launch as native"): the comparison is native against
# flatten. Results go to $OUT/${RUN_NAME:-sm100-full}/; everything else (ceilings, .dg for DeepGEMM,
# DSA_LAB_GIT_SHA) as in scripts/h200_sweep.sh. MAX_MINUTES defaults to 600 here: on a machine of
# your own the whole grid runs in one go (set it lower to run in slices and resume).
set -euo pipefail
cd "$(dirname "$0")/.."
export PRESET=sm100 RUN_NAME="${RUN_NAME:-sm100-full}" MAX_MINUTES="${MAX_MINUTES:-600}"
exec bash scripts/h200_sweep.sh "$@"
