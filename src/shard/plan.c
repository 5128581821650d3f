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
 *
 * keep_bytes: weights kept whole from one ticket to their next (same[k] =
 * i): slot of i is then no one else's until k, which finds the weight
 * there. The pairs closest together go first (the last forward weights,
 * the first backward), as long as their bytes sum to at most keep_bytes.
 * A kept ticket takes no free slot larger than itself. The slots' bytes
 * grow by about the kept bytes (greedy colouring bounds nothing exactly).
 */
#include <stdlib.h>

#include "shard_internal.h"

/* until[i]: the ticket that finds ticket i's weight in its slot (a kept
 * pair), or -1 */
static void choose_kept(const size_t *bytes, const int *same, int n, size_t keep_bytes, int *until)
{
    for (int i = 0; i < n; i++) until[i] = -1;
    if (!same || keep_bytes == 0) return;
    size_t kept = 0;
    for (;;) {
        int best = -1;
        for (int k = 0; k < n; k++) {
            const int i = same[k];
            if (i < 0 || bytes[i] == 0 || until[i] >= 0 || bytes[i] > keep_bytes - kept) continue;
            if (best < 0 || k - i < best - same[best]) best = k;
        }
        if (best < 0) return;
        until[same[best]] = best;
        kept += bytes[same[best]];
    }
}

int etp__plan_tickets(const size_t *bytes, const int *same, int n, int depth, size_t keep_bytes,
                      int *slot, size_t *slot_bytes, size_t *lower_bound)
{
    int nslots = 0;
    /* last[s]: the last ticket placed in slot s; busy[s]: the ticket that
     * slot is kept for (-1: none) */
    int *last = malloc((size_t)(n > 0 ? n : 1) * sizeof *last);
    int *busy = malloc((size_t)(n > 0 ? n : 1) * sizeof *busy);
    int *until = malloc((size_t)(n > 0 ? n : 1) * sizeof *until);
    if (!last || !busy || !until) {
        free(last);
        free(busy);
        free(until);
        return -1;
    }
    choose_kept(bytes, same, n, keep_bytes, until);
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
            busy[s] = until[i];
            slot[i] = s;
            continue;
        }
        int fit = -1, big = -1;
        for (int r = 0; r < nslots; r++) {
            if (i - last[r] <= depth || busy[r] >= i) continue;
            /* a kept ticket holds its slot long: never one larger than it
             * (a small weight would lock a big slot away), so of the
             * others the largest, grown if need be */
            if (until[i] >= 0) {
                if (slot_bytes[r] <= bytes[i] && (big < 0 || slot_bytes[r] > slot_bytes[big]))
                    big = r;
                continue;
            }
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
        busy[s] = until[i];
        slot[i] = s;
    }
    free(last);
    free(busy);
    free(until);
    *lower_bound = lb;
    return nslots;
}
