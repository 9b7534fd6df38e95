#!/usr/bin/env bash
# The serving study (issue 19) on the H200: `dsa-lab bench --preset h200-serving`, one run over several
# grids (goals, width, top-k, graphs, small batches, acceptance, heavy tail, spot check: `bench.presets.
# serving_grids`), resumable across device calls. `dsa-lab bench --preset h200-serving --dry-run` prints
# its points and estimated time per grid.
#
#   first call:   DSA_LAB_DEEPGEMM_PR340=/path/to/pr340 scripts/h200_serving.sh
#   next call:    DSA_LAB_DEEPGEMM_PR340=/path/to/pr340 scripts/h200_serving.sh PATH/TO/h200-serving
#                 (the folder the first call brought back, copied into the repo so it travels; the run
#                 resumes from its provenance: the same grids, the same order, the points left)
#
# DeepGEMM comes from .dg/ (carry [".dg"]: the vllm 0.33.0 wheel's deep_gemm, see scripts/h200_sweep.sh);
# DeepGEMM PR #340 from the build folder DSA_LAB_DEEPGEMM_PR340 names (without it its points are recorded
# as skipped, with the reason). Set DSA_LAB_GIT_SHA / DSA_LAB_GIT_DIRTY to record the commit (the device
# copy has no .git). MAX_MINUTES (default 7.5) stops the sweep cleanly, inside a point too, so a call ends
# within its 10 minutes with start-up (imports, JIT compiles, the ceilings) included. What comes back:
# $OUT/${RUN_NAME:-h200-serving}/{results.parquet, provenance.json, points.jsonl, bench.log}.
# Exit status: the bench's (130 if interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DSA_LAB_DEEPGEMM_PR340:-}" ] || [ ! -d "$DSA_LAB_DEEPGEMM_PR340" ]; then
    echo "${0##*/}: DSA_LAB_DEEPGEMM_PR340 names no folder (${DSA_LAB_DEEPGEMM_PR340:-unset}): PR #340's points will be skipped" >&2
fi
PRESET=h200-serving RUN_NAME="${RUN_NAME:-h200-serving}" exec scripts/h200_sweep.sh "$@"
