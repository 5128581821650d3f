#!/usr/bin/env bash
# Benchmarks only, on a GPU machine with 2 GPUs: build etp-bench, run each
# subcommand given as an argument (default: gather and chain), results to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/etp-bench}
mkdir -p "$out"
source tools/deps.sh
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DETP_BUILD_TESTS=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target etp-bench >/dev/null || exit 1
nvidia-smi -L | tee "$out/machine.txt"
[ $# -gt 0 ] || set -- "gather --mib 64,256,1024" "chain"
i=0
failed=0
# An argument may start with VAR=VALUE settings for that run only:
#   "ETP_NCCL_FAST_LAUNCH=1 gather --mib 64"
for sub in "$@"; do
    i=$((i + 1))
    envs=()
    while [[ "$sub" =~ ^([A-Z_][A-Z0-9_]*=[^ ]*)\ (.*)$ ]]; do
        envs+=(-x "${BASH_REMATCH[1]}")
        sub="${BASH_REMATCH[2]}"
    done
    name="${sub%% *}-$i"
    echo "== etp-bench $sub ${envs[*]}"
    mpirun -np 2 --allow-run-as-root --bind-to none "${envs[@]}" build-bench/tools/etp-bench $sub \
        --csv "$out/bench-$name.csv" 2>&1 | tee "$out/bench-$name.log" || { echo "FAILED: etp-bench $sub"; failed=1; }
done
exit $failed
