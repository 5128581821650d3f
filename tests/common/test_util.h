/*
 * Shared test helpers: a printed seed, a PRNG every rank can replay for any
 * other rank, output poisoning, and assertion wrappers that print
 * etp_last_error() when an etp call fails.
 */
#ifndef ETP_TEST_UTIL_H
#define ETP_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <setjmp.h>
#include <cmocka.h>

#include "etp/etp.h"

#define ETP_OK(expr)                                                                  \
    do {                                                                              \
        etp_status_t st_ = (expr);                                                    \
        if (st_ != ETP_SUCCESS) {                                                     \
            print_error("%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,           \
                        etp_status_string(st_), etp_last_error());                    \
            fail();                                                                   \
        }                                                                             \
    } while (0)

#define ETP_EXPECT(expr, want)                                                        \
    do {                                                                              \
        etp_status_t st_ = (expr);                                                    \
        if (st_ != (want)) {                                                          \
            print_error("%s:%d: %s -> %s (expected %s): %s\n", __FILE__, __LINE__, #expr, \
                        etp_status_string(st_), etp_status_string(want), etp_last_error()); \
            fail();                                                                   \
        }                                                                             \
    } while (0)

/* A failing call must leave a message that mentions `needle`. */
#define ETP_EXPECT_MSG(expr, want, needle)                                            \
    do {                                                                              \
        ETP_EXPECT(expr, want);                                                       \
        if (strstr(etp_last_error(), (needle)) == NULL) {                             \
            print_error("%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__,       \
                        etp_last_error(), (needle));                                  \
            fail();                                                                   \
        }                                                                             \
    } while (0)

static inline uint64_t tu_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Element i of the stream named by (seed, a, b): the same on every rank. */
static inline uint64_t tu_rand(uint64_t seed, uint64_t a, uint64_t b, uint64_t i)
{
    return tu_mix(tu_mix(tu_mix(seed ^ tu_mix(a)) ^ tu_mix(b + 0x1234)) ^ i);
}

/* The seed: ETP_TEST_SEED if set, else the clock. Printed by the caller. */
static inline uint64_t tu_pick_seed(void)
{
    const char *s = getenv("ETP_TEST_SEED");
    if (s && *s) return strtoull(s, NULL, 10);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
}

/* A program's cases split over several CTest registrations (so that each
 * runs in less time, possibly beside the others): ETP_TEST_ONLY runs the
 * cases matching its cmocka pattern, ETP_TEST_SKIP those that do not. */
static inline void tu_apply_case_filter(void)
{
    const char *only = getenv("ETP_TEST_ONLY"), *skip = getenv("ETP_TEST_SKIP");
    if (only && *only) cmocka_set_test_filter(only);
    if (skip && *skip) cmocka_set_skip_filter(skip);
}

static inline void tu_poison(void *p, size_t bytes)
{
    memset(p, 0xA5, bytes);
}

#endif /* ETP_TEST_UTIL_H */
