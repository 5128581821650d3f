#!/bin/sh
# A captured step replays the eager step's arithmetic: the per-step losses
# of `etp-train --graph` equal an eager run's of the same path (capacity
# transport, fixed slots) bit for bit.
#   graph_same.sh MPIEXEC NP ETP_TRAIN WORKDIR [options...]
set -eu
mpiexec=$1 np=$2 train=$3 dir=$4
shift 4
rm -rf "$dir"
mkdir -p "$dir"
"$mpiexec" -np "$np" --oversubscribe --bind-to none "$train" --quiet --transport capacity \
    --csv "$dir/eager.csv" "$@"
"$mpiexec" -np "$np" --oversubscribe --bind-to none "$train" --quiet --transport capacity \
    --graph --csv "$dir/graph.csv" "$@"
cut -d, -f1,2 "$dir/eager.csv" > "$dir/eager.loss"
cut -d, -f1,2 "$dir/graph.csv" > "$dir/graph.loss"
if cmp -s "$dir/eager.loss" "$dir/graph.loss"; then
    echo "graph and eager losses equal bit for bit over $(($(wc -l < "$dir/eager.loss") - 1)) steps"
else
    echo "graph and eager losses differ:"
    paste -d' ' "$dir/eager.loss" "$dir/graph.loss"
    exit 1
fi
