#!/usr/bin/env bash
# ncu_kernels.sh: runs shardlm under Nsight Compute, recording every kernel's duration (one metric, one pass;
# the clocks and caches left alone), for bench/ncu_summary.py's table of one step's kernels. Give it where
# another script wants the binary, with NCU_LOG saying where the CSV goes, e.g. on one GPU:
#
#   NCU_LOG=OUT/ncu.csv bash bench/llama_compare.sh --bin bench/ncu_kernels.sh --sides shardlm --steps 3 \
#     --warmup 1 --timeout 400 --gpus 1 l8b=input/bench/llama31-8b.ini:8:2048:2 OUT/run
#   python3 bench/ncu_summary.py OUT/ncu.csv
#
# SHARDLM_BIN: the binary (default build/bin/shardlm beside this script's folder). Needs `ncu` on PATH and a
# machine whose runtime lets it read the GPU (docs/PERFORMANCE.md, "One step's kernels"). Kernels run one at a
# time under it and the GPU idles between them, so their durations add up to less than a real step: memsets,
# copies, launch gaps and a hot GPU's lower clocks are not in them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${NCU_LOG:?NCU_LOG must name the CSV file to write}"
exec ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  --log-file "$NCU_LOG" "${SHARDLM_BIN:-$here/build/bin/shardlm}" "$@"
