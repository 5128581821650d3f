#!/bin/sh
# A checkpoint saved at one split and loaded at another continues the run:
# the losses after the load equal an uninterrupted run's within the check
# tolerance (1e-5 relative on the host backend).
#   resume.sh MPIEXEC ETP_TRAIN WORKDIR "SPLIT_A" "SPLIT_B" [options...]
set -eu
mpiexec=$1 train=$2 dir=$3 split_a=$4 split_b=$5
shift 5
rm -rf "$dir"
mkdir -p "$dir"
run() {
    "$mpiexec" -np 4 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
        "$train" --backend host --quiet "$@"
}
# shellcheck disable=SC2086
run $split_a --steps 10 --csv "$dir/whole.csv" "$@"
# shellcheck disable=SC2086
run $split_a --steps 5 --save "$dir/ckpt" "$@"
# shellcheck disable=SC2086
run $split_b --steps 5 --load "$dir/ckpt" --csv "$dir/resumed.csv" "$@"
# step,loss,...: the resumed run's steps 5..9 against the whole run's
awk -F, '
    NR == FNR { if (FNR > 1) whole[$1] = $2; next }
    FNR > 1 {
        n++
        if (!($1 in whole)) { printf "step %s: not in the whole run\n", $1; bad = 1; next }
        d = $2 - whole[$1]; if (d < 0) d = -d
        r = d / (whole[$1] < 0 ? -whole[$1] : whole[$1])
        printf "step %s: loss %.9g, uninterrupted %.9g, relative difference %.3g\n", $1, $2, whole[$1], r
        if (!(r <= 1e-5)) bad = 1
    }
    END { if (n != 5) { print "expected 5 resumed steps, got " n; bad = 1 } exit bad }
' "$dir/whole.csv" "$dir/resumed.csv"
