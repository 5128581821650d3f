#!/usr/bin/env bash
# One call on a GPU machine (see docs/TESTING.md): the README's two commands,
# then compute-sanitizer on etp's own kernels. Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/etp-gpu}
mkdir -p "$out"
{
    date -u; nvidia-smi -L; nvcc --version | tail -2
    grep -h NCCL_VERSION_CODE /usr/include/nccl.h 2>/dev/null | head -1
} 2>&1 | tee "$out/machine.txt"
echo "== quickstart"
bash tools/quickstart.sh 2>&1 | tee "$out/quickstart.log"
echo "== test suite"
bash tools/test.sh > "$out/test.log" 2>&1
rc=$?
grep -E "tests passed|Passed|Failed|SKIPPED|consumer|\*\*\*" "$out/test.log" | tail -60
echo "test.sh exit $rc"
echo "== GPU tests again with ETP_NCCL_FAST_LAUNCH=0"
(cd build-test && ETP_NCCL_FAST_LAUNCH=0 ctest -L gpu --output-on-failure > "$out/test-fast.log" 2>&1; echo "non-blocking-launch GPU tests: exit $?"; grep -E "tests passed|Failed" "$out/test-fast.log")
echo "== compute-sanitizer on etp kernels (NCCL's are excluded: they are known to trip it)"
for t in test_gpu_kernels test_gpu_shard test_quant_gpu test_ep_gpu; do
    [ -x build-test/tests/$t ] || continue
    for tool in memcheck racecheck synccheck; do
        # NCCL probes kernels of other architectures: API errors are its, not ours.
        compute-sanitizer --tool $tool --report-api-errors no --kernel-name-exclude kns=nccl \
            --target-processes all --error-exitcode 9 \
            mpirun -np 1 --allow-run-as-root build-test/tests/$t > "$out/sanitizer-$t-$tool.log" 2>&1
        echo "$t $tool: exit $?: $(grep -E 'SUMMARY' "$out/sanitizer-$t-$tool.log" | tr '\n' ' ')"
    done
done
gpus=$(nvidia-smi -L | grep -c '^GPU')
if [ "${ETP_BENCH:-1}" = 1 ] && [ "$gpus" -ge 2 ]; then
    echo "== benchmarks on 2 GPUs"
    for sub in "gather --mib 64,256,1024" "chain" ${ETP_BENCH_EXTRA:-}; do
        name=${sub%% *}
        mpirun -np 2 --allow-run-as-root --bind-to none build-test/tools/etp-bench $sub \
            --csv "$out/bench-$name.csv" --json "$out/bench-$name.json" 2>&1 | tee "$out/bench-$name.log"
    done
fi
exit $rc
