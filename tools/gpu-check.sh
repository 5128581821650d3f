#!/usr/bin/env bash
# etp on a machine with NVIDIA GPUs, in three phases (each well under 8
# minutes on 4 H100s):
#
#   tools/gpu-check.sh build      configure and build into build-gpu/, GPU tests registered
#   tools/gpu-check.sh test NP    the GPU tests at NP ranks, one GPU each (NP: 1, 2, 4 or 8;
#                                 at most the GPUs here): a line per test with its time, then
#                                 the passed/failed count; exit 1 if any failed
#   tools/gpu-check.sh bench      etp-bench gather, chain, ep and layer at one rank per GPU and
#                                 quant on one GPU, in the configurations docs/PERF.md reports
#                                 (its keys G, C1-C3, Q1-Q4, E1-E2, M1-M3), each table printed,
#                                 and etp-train's T1-T3 (summary lines)
#
# test and bench build first if anything changed. Logs and CSV files go to
# build-gpu/gpu-check/. A benchmark run is stopped after
# ETP_GPU_CHECK_TIMEOUT seconds (default 300); a test after its CTest
# TIMEOUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
source tools/deps.sh

build_dir=build-gpu
logs=$build_dir/gpu-check
limit=${ETP_GPU_CHECK_TIMEOUT:-300}

usage() {
    echo "usage: tools/gpu-check.sh build | test NP | bench   (NP: 1, 2, 4 or 8)" >&2
    exit 2
}

machine() {
    nvidia-smi -L 2>/dev/null || echo "(nvidia-smi found no GPU)"
    command -v nvcc >/dev/null && nvcc --version | tail -1
}

build() {
    mkdir -p "$logs"
    echo "== build ($build_dir, RelWithDebInfo, GPU tests registered)"
    if ! { cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=ON \
               -DETP_WARNINGS_AS_ERRORS=ON > "$logs/configure.log" 2>&1 &&
           cmake --build "$build_dir" -j"$(nproc)" > "$logs/build.log" 2>&1; }; then
        tail -40 "$logs/configure.log" "$logs/build.log" 2>/dev/null
        echo "build FAILED (logs: $logs/configure.log, $logs/build.log)"
        exit 1
    fi
    echo "built: $build_dir (log: $logs/build.log)"
}

# Fewer GPUs than ranks: the tests would all be skipped and the benchmarks
# would fail, so say so instead.
need_gpus() {
    local have
    have=$(etp_gpu_count)
    if [ "$have" -lt "$1" ]; then
        echo "gpu-check: $1 GPU(s) needed, $have found (nvidia-smi -L)" >&2
        exit 2
    fi
}

run_tests() {
    local np=$1
    need_gpus "$np"
    machine
    build
    # the tests registered at np ranks: NAME_npN or NAME_npN_VARIANT (and the
    # one-rank test_gpu_kernels, which has no count in its name)
    local pattern="_np${np}(_|\$)"
    [ "$np" = 1 ] && pattern="_np1(_|\$)|^test_gpu_kernels\$"
    echo "== GPU tests at $np rank(s) (ctest -L gpu -R '$pattern')"
    (cd "$build_dir" && ctest -L gpu -R "$pattern" --output-on-failure) > "$logs/test-np$np.log" 2>&1
    local rc=$?
    # a line per test (name, result, time), then the count and the failures
    grep -E "Test +#[0-9]+:" "$logs/test-np$np.log" | sed -E 's/^ *[0-9]+\/[0-9]+ +//'
    grep -E "tests passed|No tests were found|Total Test time" "$logs/test-np$np.log"
    if [ $rc -ne 0 ]; then
        sed -n '/The following tests FAILED/,$p' "$logs/test-np$np.log"
        echo "FAILED: see $logs/test-np$np.log (each failing test's output is in it)"
        return 1
    fi
    echo "log: $logs/test-np$np.log"
}

run_bench() {
    local np failed=0
    np=$(etp_gpu_count)
    need_gpus 1
    machine
    build
    local b=$build_dir/tools/etp-bench
    # docs/PERF.md's configurations, by its keys: KEY RANKS ARGS (RANKS "all":
    # one rank a GPU; the quantization benchmarks take one GPU)
    local runs=(
        "G all gather --mib 64,256,1024"
        "C1 all chain --loop 4 --defer-zero --stalls"
        "C2 all chain --loop 4"
        "C3 all chain --loop 4 --defer-zero --m 8192"
        "Q1 1 quant"
        "Q2 1 quant --swizzle --no-separate --cases 8x8192x4096"
        "Q3 1 quant --cases 64x1024x512 --big-mib 0 --flush-mib 4096"
        "Q4 1 quant --formats nvfp4 --cases 8x8192x4096 --no-separate --stochastic"
        "E1 all ep"
        "E2 all ep --dtype mxfp8"
        "M1 all layer"
        "M2 all layer --etp 1 --tokens 512 --variants gathered,gathered-graph"
        "M3 all layer --etp 1 --variants gathered,gathered-graph"
    )
    local run key ranks args name
    for run in "${runs[@]}"; do
        read -r key ranks args <<< "$run"
        [ "$ranks" = all ] && ranks=$np
        name="bench-$key"
        echo
        echo "== $key: etp-bench $args ($ranks rank(s))"
        rm -f "$logs/$name.csv"
        # shellcheck disable=SC2086 # the options split into words
        timeout "$limit" mpirun -np "$ranks" --bind-to none "$b" $args --csv "$logs/$name.csv" 2>&1 |
            tee "$logs/$name.log"
        local rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            echo "FAILED (exit $rc): etp-bench $args (log: $logs/$name.log)"
            failed=1
        fi
    done
    # etp-train's keys: each a pair run in turn, the second the first's peer
    local t=$build_dir/tools/etp-train
    local common="--steps 12 --pool 2 --every 4"
    local trains=(
        "T1 --etp 2 --ep 2 --transport capacity"
        "T1 --etp 2 --ep 2 --transport capacity --resident"
        "T2 --etp 1 --ep $np --transport capacity"
        "T2 --etp 1 --ep $np --transport capacity --graph"
        "T3 --etp 1 --ep $np --transport capacity --tokens 512"
        "T3 --etp 1 --ep $np --transport capacity --tokens 512 --graph"
    )
    local i=0
    for run in "${trains[@]}"; do
        read -r key args <<< "$run"
        i=$((i + 1))
        name="train-$key-$i"
        echo
        echo "== $key: etp-train $common $args ($np ranks)"
        # shellcheck disable=SC2086 # the options split into words
        timeout "$limit" mpirun -np "$np" --bind-to none "$t" $common $args \
            --csv "$logs/$name.csv" 2>&1 | tee "$logs/$name.log" | grep -E '^(loss|median|etp-train)'
        local rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            echo "FAILED (exit $rc): etp-train $args (log: $logs/$name.log)"
            failed=1
        fi
    done
    echo
    echo "logs and CSV files: $logs/"
    return $failed
}

case "${1:-}" in
    build)
        [ $# -eq 1 ] || usage
        machine
        build
        ;;
    test)
        [ $# -eq 2 ] || usage
        case "$2" in 1 | 2 | 4 | 8) ;; *) usage ;; esac
        run_tests "$2"
        ;;
    bench)
        [ $# -eq 1 ] || usage
        run_bench
        ;;
    *) usage ;;
esac
