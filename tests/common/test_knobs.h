/*
 * The library's test knobs (etp__test_knobs_t, src/core/core.h) from
 * ETP_TEST_* variables, so that CTest can register a test program again
 * with a path forced: ETP_TEST_QUANT_LAUNCH_SMS=n, ETP_TEST_QUANT_NO_CLUSTERS=1,
 * ETP_TEST_QUANT_COMPACT_ALL=1, ETP_TEST_WINDOW_ANY_SIZE=1. The library
 * reads none of them; only programs linked to etp_internal can include
 * this. Every rank must see the same variables (the window choice must
 * agree across ranks).
 */
#ifndef ETP_TEST_KNOBS_H
#define ETP_TEST_KNOBS_H

#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

/* An ETP_TEST_* knob's value: 0 when unset; a malformed one fails the program. */
static inline unsigned long tu_knob(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return 0;
    char *end;
    const unsigned long x = strtoul(v, &end, 10);
    if (*end != '\0' || x > 65536) {
        fprintf(stderr, "%s='%s': expected a count from 0 to 65536\n", name, v);
        exit(2);
    }
    return x;
}

/* Set ctx's knobs from the environment, right after creating it (before
 * the quantizers and chains whose paths they choose); rank 0 prints the
 * ones set, so that a log tells the variant. */
static inline void tu_apply_test_knobs(etp_context_t *ctx, int rank)
{
    etp__test_knobs_t *k = etp__context_test_knobs(ctx);
    k->quant_launch_sms = (uint32_t)tu_knob("ETP_TEST_QUANT_LAUNCH_SMS");
    k->quant_no_clusters = tu_knob("ETP_TEST_QUANT_NO_CLUSTERS") != 0;
    k->quant_compact_all = tu_knob("ETP_TEST_QUANT_COMPACT_ALL") != 0;
    k->window_any_size = tu_knob("ETP_TEST_WINDOW_ANY_SIZE") != 0;
    if (rank == 0 && (k->quant_launch_sms || k->quant_no_clusters || k->quant_compact_all || k->window_any_size))
        printf("test knobs: quant_launch_sms %u, quant_no_clusters %d, quant_compact_all %d, "
               "window_any_size %d\n",
               (unsigned)k->quant_launch_sms, k->quant_no_clusters, k->quant_compact_all, k->window_any_size);
}

#endif
