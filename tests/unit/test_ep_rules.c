/*
 * EP rules the CUDA kernels rely on beyond what the host backend runs:
 * etp__ep_never_clipped, which lets a low-latency dispatch store its
 * tokens before every rank's counts are in, against EXACT's clip
 * (etp__ep_accepted) on random count matrices and on the worst case.
 */
#include "test_util.h"
#include "ep/ep_rules.h"

static uint64_t g_seed;

enum { MAX_R = 32 };

/* Where the rule holds for rank s, the clip keeps all of s's tokens to
 * every rank, whatever the counts (each at most t_max). */
static void test_never_clipped_keeps_everything(void **state)
{
    (void)state;
    int32_t C[MAX_R * MAX_R];
    int held = 0;
    for (uint64_t it = 0; it < 4000; it++) {
        const int R = 1 + (int)(tu_rand(g_seed, 1, it, 0) % MAX_R);
        const int64_t tm = 1 + (int64_t)(tu_rand(g_seed, 1, it, 1) % 300);
        const int64_t cap = 1 + (int64_t)(tu_rand(g_seed, 1, it, 2) % (uint64_t)(R * tm + 20));
        /* counts near t_max more often than not: the clip's edge */
        for (int x = 0; x < R * R; x++) {
            const uint64_t u = tu_rand(g_seed, 2, it, (uint64_t)x);
            C[x] = (int32_t)(u % 4 ? tm - (int64_t)(u >> 8) % 3 : (int64_t)(u >> 8) % (tm + 1));
            if (C[x] < 0) C[x] = 0;
        }
        for (int s = 0; s < R; s++) {
            if (!etp__ep_never_clipped(s, tm, cap)) continue;
            held++;
            for (int d = 0; d < R; d++) {
                const int64_t acc = etp__ep_accepted(C, R, cap, s, d);
                if (acc != C[s * R + d])
                    fail_msg("R %d, t_max %lld, tok_cap %lld: rank %d's %d tokens to rank %d, "
                             "%lld accepted",
                             R, (long long)tm, (long long)cap, s, C[s * R + d], d, (long long)acc);
            }
        }
    }
    assert_true(held > 200); /* the cases exercised the rule */
}

/* Where it does not hold, some counts (every rank sending every rank
 * t_max tokens) make the clip drop a token of s: the rule is exact, not
 * merely safe. */
static void test_never_clipped_is_tight(void **state)
{
    (void)state;
    int32_t C[MAX_R * MAX_R];
    for (int R = 1; R <= MAX_R; R++)
        for (int64_t tm = 1; tm <= 9; tm++)
            for (int64_t cap = 1; cap <= R * tm + 2; cap++) {
                for (int x = 0; x < R * R; x++) C[x] = (int32_t)tm;
                for (int s = 0; s < R; s++) {
                    const int rule = etp__ep_never_clipped(s, tm, cap);
                    int dropped = 0;
                    for (int d = 0; d < R; d++)
                        dropped |= etp__ep_accepted(C, R, cap, s, d) < tm;
                    if (rule == dropped)
                        fail_msg("R %d, t_max %lld, tok_cap %lld, rank %d: rule %d, a drop %d", R,
                                 (long long)tm, (long long)cap, s, rule, dropped);
                }
            }
}

int main(void)
{
    g_seed = tu_pick_seed();
    printf("test_ep_rules: seed %llu (rerun with ETP_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_clipped_keeps_everything),
        cmocka_unit_test(test_never_clipped_is_tight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
