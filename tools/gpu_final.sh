#!/usr/bin/env bash
# A session's GPU record, in parts that each fit one device call (10
# minutes): `tests` (every GPU test, no sanitizer build), `sanitize`
# (compute-sanitizer on the quantization kernels), `bench` (the benchmarks
# of docs/PERF.md), or `all` (the three in turn: more than one call's time).
# Each part builds what it needs (about 20 s on 16 cores). Results under
# $OUT (default /tmp/etp-final). The device call starts with
#   source .deps/gpu-env.sh; bash tools/gpu_final.sh tests
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
out=${OUT:-/tmp/etp-final}
mkdir -p "$out"
source tools/deps.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi -L > "$out/machine.txt"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=ON -DETP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build-test -j"$(nproc)" > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }

# every step's failure counts: the script exits 1 if any step failed
failed=0
fail() { echo "FAILED: $*"; failed=1; }

tests() {
    (cd build-test && timeout 300 ctest -L gpu -j3 --output-on-failure --timeout 200 > "$out/test.log" 2>&1) ||
        fail "ctest -L gpu (see $out/test.log)"
    grep -E "tests passed|Failed|\*\*\*|Timeout" "$out/test.log"
    (cd build-test && ETP_QUANT_CAST_KERNEL=2 timeout 120 ctest -R "test_quant_gpu_np1" --timeout 100 > "$out/test-cast2.log" 2>&1) ||
        fail "ctest with ETP_QUANT_CAST_KERNEL=2 (see $out/test-cast2.log)"
    echo "cast kernel 2:"; grep -E "tests passed|Failed" "$out/test-cast2.log"
}

sanitize() {
    for t in test_quant_gpu test_quant_swizzle_gpu; do
        for tool in memcheck racecheck synccheck; do
            timeout 150 compute-sanitizer --tool $tool --report-api-errors no --kernel-name-exclude kns=nccl \
                --target-processes all --error-exitcode 9 \
                mpirun -np 1 --allow-run-as-root build-test/tests/$t > "$out/san-$t-$tool.log" 2>&1
            rc=$?
            echo "$t $tool: exit $rc: $(grep -E 'SUMMARY' "$out/san-$t-$tool.log" | tr '\n' ' ')"
            [ $rc -eq 0 ] || fail "$t under $tool"
        done
    done
}

bench() {
    local b=build-test/tools/etp-bench
    # the whole log, errors included (a stale CSV of an earlier run is removed first)
    run() {
        name=$1; shift
        rm -f "$out/bench-$name.csv"
        timeout 150 mpirun -np 2 --allow-run-as-root --bind-to none "$@" --csv "$out/bench-$name.csv" \
            > "$out/bench-$name.log" 2>&1 || fail "etp-bench $name (see $out/bench-$name.log)"
        cat "$out/bench-$name.log"
    }
    run gather $b gather --mib 64,256,1024
    run quant $b quant
    run ep $b ep
    run ep-mxfp8 $b ep --dtype mxfp8
    run chain-loop $b chain --loop 4
    run chain-dz $b chain --loop 4 --defer-zero --stalls
    run chain-dz-d2 $b chain --loop 4 --defer-zero --depth 2 --stalls
    run chain-m8k-dz $b chain --m 8192 --loop 4 --defer-zero
}

case "$part" in
    tests) tests ;;
    sanitize) sanitize ;;
    bench) bench ;;
    all) tests; sanitize; bench ;;
    *) echo "usage: gpu_final.sh tests|sanitize|bench|all" >&2; exit 2 ;;
esac
exit $failed
