#!/usr/bin/env bash
# The last GPU call of a session, when device time is short: the whole suite
# with the GPU tests (no sanitizer build), the GPU tests again with the other
# ETP_NCCL_FAST_LAUNCH setting, compute-sanitizer on the quantization kernels,
# then the benchmarks. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/etp-final}
mkdir -p "$out"
source tools/deps.sh
nvidia-smi -L > "$out/machine.txt"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=ON -DETP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build-test -j"$(nproc)" > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
(cd build-test && ctest -LE soak -j4 --output-on-failure > "$out/test.log" 2>&1)
grep -E "tests passed|Failed|\*\*\*" "$out/test.log"
(cd build-test && ETP_NCCL_FAST_LAUNCH=0 ctest -L gpu --output-on-failure > "$out/test-fast.log" 2>&1)
echo "non-blocking launch:"; grep -E "tests passed|Failed|\*\*\*" "$out/test-fast.log"
for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --report-api-errors no --kernel-name-exclude kns=nccl \
        --target-processes all --error-exitcode 9 \
        mpirun -np 1 --allow-run-as-root build-test/tests/test_quant_gpu > "$out/san-quant-$tool.log" 2>&1
    echo "test_quant_gpu $tool: exit $?: $(grep -E 'SUMMARY' "$out/san-quant-$tool.log" | tr '\n' ' ')"
done
b=build-test/tools/etp-bench
run() { name=$1; shift; mpirun -np 2 --allow-run-as-root --bind-to none "$@" --csv "$out/bench-$name.csv" > "$out/bench-$name.log" 2>&1; tail -n +2 "$out/bench-$name.log" | grep -v "^etp-bench" ; }
run gather $b gather --mib 64,256,1024
run gather-nonblocking -x ETP_NCCL_FAST_LAUNCH=0 $b gather --mib 64,256,1024
run quant $b quant
run ep $b ep
run chain $b chain
