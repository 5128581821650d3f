#!/usr/bin/env bash
# Build etp and pass the whole test suite: unit and MPI tests (2, 3, 4 ranks),
# the GPU tests when a GPU is present, out-of-tree programs (tests/consumer,
# examples/) linking the installed etp, before and after the installed tree
# is moved, the unit and MPI tests again under ASan+UBSan, and most of them
# under valgrind's memcheck (uninitialized reads, which ASan misses).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
etp_install_missing libcmocka-dev
jobs=$(nproc)
gpus=$(etp_gpu_count)
# valgrind registers the memcheck tests (label valgrind); GPU machines have
# no network to install it from, and go on without them.
if [ "$gpus" -eq 0 ]; then etp_install_missing valgrind; fi
gpu_flag=OFF
[ "$gpus" -gt 0 ] && gpu_flag=ON

echo "== the README's program is examples/collectives.c"
# The README shows the file verbatim: the fenced block after its marker line.
if ! awk '/^<!-- examples\/collectives.c/ {m = 1; next}
          m && /^```/ {if (f) exit; f = 1; next}
          f' README.md | diff -u examples/collectives.c - ; then
    echo "README.md's program differs from examples/collectives.c (above: what to change)" >&2
    exit 1
fi

echo "== build (GPU tests: $gpu_flag)"
# No install prefix here: it is chosen when installing, below.
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=$gpu_flag -DETP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build-test -j"$jobs"

echo "== install, then use etp from outside the tree"
# Built against the etp installed at $1, in $2, and run with no
# LD_LIBRARY_PATH: tests/consumer through CMake and through pkg-config,
# examples/collectives.c as its header says, and the installed programs.
# Two ranks on the host backend or on two GPUs; with one GPU, one rank on it
# and two on the host backend (the GPU hidden).
run_np2() {
    if [ "$gpus" -eq 1 ]; then
        env -u LD_LIBRARY_PATH mpirun -np 1 --bind-to none "$@"
        env -u LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES= mpirun -np 2 --oversubscribe --bind-to none "$@"
    else
        env -u LD_LIBRARY_PATH mpirun -np 2 --oversubscribe --bind-to none "$@"
    fi
}
use_installed() {
    local prefix=$1 out=$2 pc
    pc=$(echo "$prefix"/lib*/pkgconfig)
    rm -rf "$out" && mkdir -p "$out"
    cmake -S tests/consumer -B "$out/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
    cmake --build "$out/consumer" >/dev/null
    run_np2 "$out/consumer/etp_consumer"
    # pkg-config gives no run path: a program outside the system's library
    # directories names etp's libdir itself
    local flags
    flags="$(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs etp) -Wl,-rpath,$(PKG_CONFIG_PATH="$pc" pkg-config --variable=libdir etp)"
    # shellcheck disable=SC2086
    cc -Wall -Wextra -Werror -o "$out/etp_consumer_pc" tests/consumer/main.c $flags
    run_np2 "$out/etp_consumer_pc"
    # shellcheck disable=SC2086
    cc -Wall -Wextra -Werror -o "$out/collectives" examples/collectives.c $flags
    run_np2 "$out/collectives"
    env -u LD_LIBRARY_PATH "$prefix/bin/etp-bench" --help >/dev/null
    run_np2 "$prefix/bin/etp-demo" --steps 2 --rows 256 --cols 64
}
inst="$PWD/build-test/_install"
rm -rf "$inst" "$inst-moved"
cmake --install build-test --prefix "$inst" >/dev/null
use_installed "$inst" build-test/use-installed
# Nothing in the installed tree names its place: it still works moved.
mv "$inst" "$inst-moved"
use_installed "$inst-moved" build-test/use-moved
echo "exported symbols outside etp_*:"
if nm -D --defined-only build-test/libetp.so | awk '{print $3}' | grep -v '^etp_' | grep .; then
    echo "libetp.so exports symbols without the etp_ prefix" >&2
    exit 1
fi
echo "(none)"

if grep -q 'ETP_HAVE_CUDA 1' build-test/include/etp/etp_config.h; then
    echo "== the library for sm_90 and sm_100 (B200), compile only"
    cmake -S . -B build-sm100 -DETP_CUDA_SM100=ON -DETP_BUILD_TESTS=OFF -DETP_BUILD_TOOLS=OFF \
          -DETP_WARNINGS_AS_ERRORS=ON >/dev/null
    cmake --build build-sm100 -j"$jobs" >/dev/null
fi

# ctest in the current folder; when tests fail, what reproduces them is
# printed again last (a CI log may keep only its tail): each failing rank's
# seed line (tests/common/mpi_util.h), cmocka's failed cases, sanitizer
# verdicts.
run_ctest() {
    ctest "$@" && return 0
    echo "== what failed, again (from Testing/Temporary/LastTest.log)"
    grep -hE 'failed [0-9]+ test\(s\); seed|\[  FAILED  \] [a-z_]|\[  ERROR   \] ---|\.c:[0-9]+: error:|ERROR: (Address|Leak)Sanitizer|runtime error:|ERROR SUMMARY: [1-9]' \
        Testing/Temporary/LastTest.log | sort | uniq -c | head -60 || true
    return 1
}

echo "== unit and MPI tests under ASan+UBSan (host backend)"
cmake -S . -B build-asan -DETP_WARNINGS_AS_ERRORS=ON -DETP_SANITIZE=ON -DETP_WITH_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && run_ctest -L 'unit|mpi' -LE soak --output-on-failure -j"$jobs")

echo "== the whole suite"
cd build-test
run_ctest -LE soak --output-on-failure -j"$jobs"
