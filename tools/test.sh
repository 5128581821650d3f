#!/usr/bin/env bash
# Build etp and pass the whole test suite: unit and MPI tests (2, 3, 4 ranks),
# the GPU tests when a GPU is present, an out-of-tree project linking the
# installed etp, the unit and MPI tests again under ASan+UBSan, and most of
# them under valgrind's memcheck (uninitialized reads, which ASan misses).
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

echo "== build (GPU tests: $gpu_flag)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DETP_GPU_TESTS=$gpu_flag -DETP_WARNINGS_AS_ERRORS=ON \
      -DCMAKE_INSTALL_PREFIX="$PWD/build-test/_install" >/dev/null
cmake --build build-test -j"$jobs"

echo "== install, then link etp from a project outside the tree"
rm -rf build-test/_install build-test/consumer
cmake --install build-test >/dev/null
cmake -S tests/consumer -B build-test/consumer -DCMAKE_PREFIX_PATH="$PWD/build-test/_install" >/dev/null
cmake --build build-test/consumer >/dev/null
LD_LIBRARY_PATH="$PWD/build-test/_install/lib:${LD_LIBRARY_PATH:-}" \
    mpirun -np 2 --oversubscribe --bind-to none build-test/consumer/etp_consumer
PKG_CONFIG_PATH="$PWD/build-test/_install/lib/pkgconfig" \
    cc -o build-test/consumer/etp_consumer_pc tests/consumer/main.c $(PKG_CONFIG_PATH="$PWD/build-test/_install/lib/pkgconfig" pkg-config --cflags --libs etp)
LD_LIBRARY_PATH="$PWD/build-test/_install/lib:${LD_LIBRARY_PATH:-}" \
    mpirun -np 1 build-test/consumer/etp_consumer_pc
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
cmake -S . -B build-asan -DETP_WARNINGS_AS_ERRORS=ON -DETP_SANITIZE=ON -DETP_WITH_CUDA=OFF -DETP_BUILD_TOOLS=OFF >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && run_ctest -L 'unit|mpi' -LE soak --output-on-failure -j"$jobs")

echo "== the whole suite"
cd build-test
run_ctest -LE soak --output-on-failure -j"$jobs"
