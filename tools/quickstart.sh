#!/usr/bin/env bash
# Install what is missing, build etp, and run the main job: etp-train, a
# mixture-of-experts training loop on etp (docs/TRAINING.md), on 4 host ranks,
# or on every GPU when the machine has them (the CUDA backend).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/deps.sh
etp_install_missing
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DETP_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"
gpus=$(etp_gpu_count)
if [ "$gpus" -gt 0 ] && grep -q 'ETP_HAVE_CUDA 1' build/include/etp/etp_config.h; then
    np=$gpus
else
    np=4
fi
mpirun -np "$np" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 build/tools/etp-train "$@"
