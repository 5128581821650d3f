/*
 * The ticket planner. Under the chain's contract a gather is issued at most
 * `depth` calls before it is needed and released before the next gather, so
 * tickets i and j are alive together exactly when |i - j| <= depth. Slots
 * are coloured greedily in order, best fit: among the slots free for ticket
 * i (last tenant more than depth before), the smallest that fits, else the
 * largest (grown), else a new one. Before that, a ticket whose weight's
 * previous ticket (same[i]) is still the last tenant of its slot takes
 * that slot, even within depth: the chain then finds the weight there and
 * does not gather it again (the last layer's weights at the turn from
 * forward to backward). The lower bound on bytes is the largest sum over
 * depth + 1 consecutive tickets, each weight once, which any plan must
 * hold at once. Returns the number of slots, or -1 when out of host memory.
 */
#include <stdlib.h>

#include "shard_internal.h"

int etp__plan_tickets(const size_t *bytes, const int *same, int n, int depth, int *slot,
                      size_t *slot_bytes, size_t *lower_bound)
{
    int nslots = 0;
    /* last[s]: the last ticket placed in slot s */
    int *last = malloc((size_t)(n > 0 ? n : 1) * sizeof *last);
    if (!last) return -1;
    size_t lb = 0;
    for (int i = 0; i < n; i++) {
        if (bytes[i] == 0) {
            slot[i] = -1;
            continue;
        }
        size_t window = 0;
        for (int k = i; k < n && k <= i + depth; k++)
            if (!same || same[k] < i) window += bytes[k];
        if (window > lb) lb = window;

        /* the weight's last slot, untouched since: its data is still there */
        int s = -1;
        if (same && same[i] >= 0)
            for (int r = 0; r < nslots; r++)
                if (last[r] == same[i]) s = r;
        if (s >= 0) {
            if (slot_bytes[s] < bytes[i]) slot_bytes[s] = bytes[i];
            last[s] = i;
            slot[i] = s;
            continue;
        }
        int fit = -1, big = -1;
        for (int r = 0; r < nslots; r++) {
            if (i - last[r] <= depth) continue;
            if (slot_bytes[r] >= bytes[i] && (fit < 0 || slot_bytes[r] < slot_bytes[fit])) fit = r;
            if (big < 0 || slot_bytes[r] > slot_bytes[big]) big = r;
        }
        s = fit >= 0 ? fit : big;
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
