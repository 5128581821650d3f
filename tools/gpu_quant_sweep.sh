#!/usr/bin/env bash
# A seed sweep of the quantization GPU tests, on a GPU machine (see
# docs/TESTING.md): every seed draws fresh shapes, tensor counts and data,
# and each runs under the launch variants the CTest entries use (default;
# 8 SMs with compacted scales, with and without clusters; compacted scales
# alone). Runs seeds FIRST+1, FIRST+2, ... until SECONDS have passed (a seed
# started before then finishes: about 2.5 minutes on an H100, 12 runs). Prints each failure's seed, test and
# variables; exits 1 if any failed. Logs of failures go to $OUT when set.
#
#   bash tools/gpu_quant_sweep.sh [SECONDS (default 300)] [FIRST (default: the clock)]
#
# Reproduce a failure: ETP_TEST_SEED=<seed> <variables> mpirun -np 1 build-sweep/tests/<test>
set -uo pipefail
cd "$(dirname "$0")/.."
budget=${1:-300}
seed=${2:-$(( $(date +%s) % 1000000 * 1000 ))}
case "$budget$seed" in
    *[!0-9]*) echo "usage: gpu_quant_sweep.sh [SECONDS] [FIRST_SEED]: whole numbers, not '$budget' '$seed'" >&2
              exit 2 ;;
esac
# without a GPU the tests skip, and every run would count as a pass
nvidia-smi -L > /dev/null 2>&1 || { echo "gpu_quant_sweep.sh: no GPU here (nvidia-smi -L failed)" >&2; exit 2; }
out=${OUT:-/tmp/etp-sweep}
mkdir -p "$out"
t0=$(date +%s)
tests="test_quant_gpu test_quant_swizzle_gpu test_quant_graph_gpu"
cmake -S . -B build-sweep -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$out/sweep-build.log" 2>&1 &&
    cmake --build build-sweep -j"$(nproc)" --target $tests >> "$out/sweep-build.log" 2>&1 ||
    { echo "build failed: $out/sweep-build.log"; exit 2; }
variants=(""
    "ETP_QUANT_LAUNCH_SMS=8 ETP_QUANT_CAST_CLUSTERS=1 ETP_QUANT_CAST_COMPACT=2"
    "ETP_QUANT_LAUNCH_SMS=8 ETP_QUANT_CAST_CLUSTERS=0 ETP_QUANT_CAST_COMPACT=2"
    "ETP_QUANT_CAST_COMPACT=2")
runs=0 fails=0 seeds=0
first=$((seed + 1))
while [ $(( $(date +%s) - t0 )) -lt "$budget" ]; do
    seed=$((seed + 1)) seeds=$((seeds + 1))
    for v in "${variants[@]}"; do
        for t in $tests; do
            env $v ETP_TEST_SEED=$seed ETP_TIMEOUT_S=120 NCCL_NVLS_ENABLE=0 timeout 300 \
                mpirun -np 1 --allow-run-as-root --bind-to none build-sweep/tests/$t > "$out/sweep-one.log" 2>&1
            rc=$?
            runs=$((runs + 1))
            if [ $rc -ne 0 ]; then
                fails=$((fails + 1))
                echo "FAIL: ETP_TEST_SEED=$seed $v $t (exit $rc)"
                cp "$out/sweep-one.log" "$out/sweep-fail-$fails.log"
            fi
        done
    done
    # a line a seed: a run cut short still says how far it got
    echo "seed $seed done: $runs runs, $fails failed, $(( $(date +%s) - t0 )) s"
done
echo "seeds $first..$seed: $runs runs, $fails failed, $(( $(date +%s) - t0 )) s"
[ "$fails" -eq 0 ]
