/*
 * The ticket planner. Under the chain's contract a gather is issued at most
 * `depth` calls before it is needed and released before the next gather, so
 * tickets i and j are alive together exactly when |i - j| <= depth. Slots
 * are coloured greedily in order, best fit: among the slots free for ticket
 * i (last tenant more than depth before), the smallest that fits, else the
 * largest (grown), else a new one. The lower bound on bytes is the largest
 * sum over depth + 1 consecutive tickets, which any plan must hold at once.
 * Returns the number of slots, or -1 when out of host memory.
 */
#include <stdlib.h>

#include "shard_internal.h"

int etp__plan_tickets(const size_t *bytes, int n, int depth, int *slot, size_t *slot_bytes,
                      size_t *lower_bound)
{
    int nslots = 0;
    /* last[s]: the last ticket placed in slot s */
    int *last = malloc((size_t)(n > 0 ? n : 1) * sizeof *last);
    if (!last) return -1;
    size_t lb = 0;
    for (int i = 0; i < n; i++) {
        size_t window = 0;
        for (int k = i; k < n && k <= i + depth; k++) window += bytes[k];
        if (window > lb) lb = window;

        int fit = -1, big = -1;
        for (int s = 0; s < nslots; s++) {
            if (i - last[s] <= depth) continue;
            if (slot_bytes[s] >= bytes[i] && (fit < 0 || slot_bytes[s] < slot_bytes[fit])) fit = s;
            if (big < 0 || slot_bytes[s] > slot_bytes[big]) big = s;
        }
        int s = fit >= 0 ? fit : big;
        if (s < 0) {
            s = nslots++;
            slot_bytes[s] = 0;
        }
        if (slot_bytes[s] < bytes[i]) slot_bytes[s] = bytes[i];
        last[s] = i;
        slot[i] = s;
    }
    free(last);
    *lower_bound = lb;
    return nslots;
}
