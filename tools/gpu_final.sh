#!/usr/bin/env bash
# The last GPU call of a session, when device time is short: the GPU tests
# (no sanitizer build), compute-sanitizer on the quantization kernels, then
# the benchmarks, each bounded in time. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/etp-final}
mkdir -p "$out"
source tools/deps.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi -L > "$out/machine.txt"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=ON -DETP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build-test -j"$(nproc)" > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
(cd build-test && timeout 300 ctest -L gpu -j2 --output-on-failure --timeout 150 > "$out/test.log" 2>&1)
grep -E "tests passed|Failed|\*\*\*|Timeout" "$out/test.log"
(cd build-test && ETP_QUANT_CAST_KERNEL=2 timeout 120 ctest -R test_quant_gpu --timeout 100 > "$out/test-cast2.log" 2>&1)
echo "cast kernel 2:"; grep -E "tests passed|Failed" "$out/test-cast2.log"
for t in test_quant_gpu test_quant_swizzle_gpu; do
    for tool in memcheck racecheck; do
        timeout 120 compute-sanitizer --tool $tool --report-api-errors no --kernel-name-exclude kns=nccl \
            --target-processes all --error-exitcode 9 \
            mpirun -np 1 --allow-run-as-root build-test/tests/$t > "$out/san-$t-$tool.log" 2>&1
        echo "$t $tool: exit $?: $(grep -E 'SUMMARY' "$out/san-$t-$tool.log" | tr '\n' ' ')"
    done
done
b=build-test/tools/etp-bench
run() { name=$1; shift; timeout 150 mpirun -np 2 --allow-run-as-root --bind-to none "$@" --csv "$out/bench-$name.csv" > "$out/bench-$name.log" 2>&1; tail -n +2 "$out/bench-$name.log" | grep -v "^etp-bench" ; }
run gather $b gather --mib 64,256,1024
run gather-noce -x ETP_COPY_ENGINE=0 $b gather --mib 256,1024
run quant $b quant
run quant-cast2 -x ETP_QUANT_CAST_KERNEL=2 $b quant
run ep $b ep
run ep-mxfp8 $b ep --dtype mxfp8
run chain $b chain
run chain-loop $b chain --loop 4
run chain-m8k $b chain --m 8192 --loop 4
run chain-noce -x ETP_COPY_ENGINE=0 $b chain --loop 4
run chain-pou $b chain --loop 4 --update --prefetch-on-update
