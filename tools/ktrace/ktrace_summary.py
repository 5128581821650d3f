#!/usr/bin/env python3
"""Summaries of libetp-ktrace files (tools/ktrace/ktrace.c).

  ktrace_summary.py DIR                  per process: each kernel, copy and
                                         memset by name and grid, with its
                                         count and median/min/max time (us)
  ktrace_summary.py DIR --seq NAME N [--at I]
                                         per process: the N records from the
                                         I-th (default 5th) whose name holds
                                         NAME, with the gap before each and
                                         its duration (us)
"""
import argparse
import collections
import glob
import os
import statistics
import sys


def load(path):
    recs = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 7:
                continue
            recs.append((int(p[2]), int(p[3]), p[1], int(p[4]), int(p[6])))
    recs.sort()
    return recs


def table(recs, out):
    by = collections.defaultdict(list)
    for s, e, name, _, grid in recs:
        by[(name, grid)].append((e - s) / 1000.0)
    rows = sorted(by.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1]))
    for (name, grid), v in rows:
        out.write("%6d  med %9.1f  min %9.1f  max %9.1f  grid %5d  %s\n"
                  % (len(v), statistics.median(v), min(v), max(v), grid, name[:90]))


def seq(recs, key, n, at, out):
    hits = [i for i, r in enumerate(recs) if key in r[2]]
    if len(hits) <= at:
        out.write("  (only %d records hold %r)\n" % (len(hits), key))
        return
    i0 = hits[at]
    t0, prev = recs[i0][0], None
    for s, e, name, stream, _ in recs[i0:i0 + n]:
        gap = (s - prev) / 1000.0 if prev is not None else 0.0
        out.write("%9.1f  +%7.1f  %8.1f us  stream %d  %s\n"
                  % ((s - t0) / 1000.0, gap, (e - s) / 1000.0, stream, name[:90]))
        prev = e


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--seq", nargs=2, metavar=("NAME", "N"))
    ap.add_argument("--at", type=int, default=5)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "ktrace.*.tsv")))
    if not files:
        sys.exit("ktrace_summary.py: no ktrace.*.tsv in %s" % a.dir)
    for f in files:
        sys.stdout.write("== %s\n" % os.path.basename(f))
        recs = load(f)
        if a.seq:
            seq(recs, a.seq[0], int(a.seq[1]), a.at, sys.stdout)
        else:
            table(recs, sys.stdout)


if __name__ == "__main__":
    main()
