/* The ticket planner on random chains: tickets within depth never share a
 * slot, slots hold their tenants and are no larger than the largest of
 * them, and the bytes are at least the lower bound. */
#include "test_util.h"
#include "shard/shard_internal.h"

static uint64_t g_seed;

static void check_plan(const size_t *bytes, int n, int depth)
{
    int slot[512];
    size_t sb[512], lb = 0;
    int ns = etp__plan_tickets(bytes, NULL, n, depth, 0, slot, sb, &lb);
    assert_true(ns >= 1 && ns <= n);
    size_t total = 0, window_max = 0;
    for (int s = 0; s < ns; s++) total += sb[s];
    for (int i = 0; i < n; i++) {
        assert_true(slot[i] >= 0 && slot[i] < ns);
        assert_true(sb[slot[i]] >= bytes[i]);
        for (int j = i + 1; j < n && j <= i + depth; j++) assert_int_not_equal(slot[i], slot[j]);
        size_t w = 0;
        for (int k = i; k < n && k <= i + depth; k++) w += bytes[k];
        if (w > window_max) window_max = w;
    }
    assert_int_equal(lb, window_max); /* computed independently here */
    assert_true(total >= lb);
    /* and no slot is larger than its largest tenant: with depth + 1 slots
     * (below) the total is at most (depth + 1) x the largest ticket */
    for (int s = 0; s < ns; s++) {
        size_t tenant_max = 0;
        for (int i = 0; i < n; i++)
            if (slot[i] == s && bytes[i] > tenant_max) tenant_max = bytes[i];
        assert_int_equal(sb[s], tenant_max);
    }
    /* a slot is always free once depth + 1 exist: no more are made */
    assert_int_equal(ns, n < depth + 1 ? n : depth + 1);
}

static void test_uniform_sizes_are_optimal(void **state)
{
    (void)state;
    size_t bytes[48];
    for (int depth = 0; depth <= 4; depth++) {
        for (int i = 0; i < 48; i++) bytes[i] = 4096;
        int slot[48];
        size_t sb[48], lb;
        int ns = etp__plan_tickets(bytes, NULL, 48, depth, 0, slot, sb, &lb);
        assert_int_equal(ns, depth + 1);
        assert_int_equal(lb, (size_t)(depth + 1) * 4096);
        size_t total = 0;
        for (int s = 0; s < ns; s++) total += sb[s];
        assert_int_equal(total, lb);
    }
}

static void test_random_chains(void **state)
{
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(tu_rand(g_seed, 1, (uint64_t)trial, 0) % 200);
        int depth = (int)(tu_rand(g_seed, 2, (uint64_t)trial, 0) % 5);
        size_t bytes[512];
        /* a chain forward then backward, as etp_chain_finalize builds it */
        int half = (n + 1) / 2;
        for (int i = 0; i < half; i++) {
            bytes[i] = 1 + tu_rand(g_seed, 3, (uint64_t)trial, (uint64_t)i) % 100000;
            bytes[2 * half - 1 - i] = bytes[i];
        }
        check_plan(bytes, 2 * half, depth);
    }
}

/* A chain forward then backward of `half` weights of random sizes below
 * `max` (stream `stream` of the seed): each backward ticket names its
 * forward one in same[]. Returns the weights' bytes, each counted once. */
static size_t forward_backward(int trial, uint64_t stream, int half, size_t max, size_t *bytes,
                               int *same)
{
    const int n = 2 * half;
    size_t total = 0;
    for (int i = 0; i < half; i++) {
        bytes[i] = 1 + tu_rand(g_seed, stream, (uint64_t)trial, (uint64_t)i) % max;
        bytes[n - 1 - i] = bytes[i];
        same[i] = -1;
        same[n - 1 - i] = i;
        total += bytes[i];
    }
    return total;
}

/* Forward then backward with each backward ticket naming its forward one:
 * a ticket takes its weight's slot whenever nothing was placed there since
 * (the turn's tickets always do), other tickets within depth never
 * share a slot, and the lower bound counts each weight once a window. */
static void test_reuse_of_the_same_weight(void **state)
{
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        const int half = 1 + (int)(tu_rand(g_seed, 4, (uint64_t)trial, 0) % 100), n = 2 * half;
        const int depth = (int)(tu_rand(g_seed, 5, (uint64_t)trial, 0) % 5);
        size_t bytes[200], sb[200], lb = 0;
        int same[200], slot[200];
        forward_backward(trial, 6, half, 100000, bytes, same);
        const int ns = etp__plan_tickets(bytes, same, n, depth, 0, slot, sb, &lb);
        assert_true(ns >= 1 && ns <= n);
        assert_int_equal(slot[half], slot[half - 1]);
        size_t window_max = 0;
        for (int i = 0; i < n; i++) {
            assert_true(sb[slot[i]] >= bytes[i]);
            if (same[i] >= 0) {
                int untouched = 1;
                for (int k = same[i] + 1; k < i; k++) untouched &= slot[k] != slot[same[i]];
                if (untouched) assert_int_equal(slot[i], slot[same[i]]);
            }
            for (int j = i + 1; j < n && j <= i + depth; j++)
                if (same[j] != i) assert_int_not_equal(slot[i], slot[j]);
            size_t w = 0;
            for (int k = i; k < n && k <= i + depth; k++)
                if (same[k] < i) w += bytes[k];
            if (w > window_max) window_max = w;
        }
        assert_int_equal(lb, window_max);
    }
}

/* Forward then backward with a budget of kept bytes: every pair that the
 * budget takes, closest first while its bytes fit what is left, is kept
 * (no other ticket takes its slot between them, and the backward ticket
 * takes it; other pairs may find their slot untouched anyway, as at the
 * turn), and tickets within depth still never share a slot. With an
 * unbounded budget every pair is kept. */
static void test_kept_pairs(void **state)
{
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        const int half = 1 + (int)(tu_rand(g_seed, 11, (uint64_t)trial, 0) % 60), n = 2 * half;
        const int depth = (int)(tu_rand(g_seed, 12, (uint64_t)trial, 0) % 4);
        size_t bytes[120], sb[120], lb = 0;
        int same[120], slot[120];
        const size_t total = forward_backward(trial, 13, half, 1000, bytes, same);
        const int all = trial % 4 == 0;
        const size_t budget = all ? SIZE_MAX
                                  : tu_rand(g_seed, 14, (uint64_t)trial, 0) % (total + 1);
        const int ns = etp__plan_tickets(bytes, same, n, depth, budget, slot, sb, &lb);
        assert_true(ns >= 1 && ns <= n);
        /* pair of forward ticket i: (i, n - 1 - i), closer for larger i;
         * kept: the slot is no one else's in between */
        size_t kept_bytes = 0, left = budget;
        for (int i = half - 1; i >= 0; i--) {
            const int k = n - 1 - i;
            int kept = slot[k] == slot[i];
            for (int j = i + 1; j < k; j++) kept &= slot[j] != slot[i];
            /* the budget's rule, closest first */
            if (bytes[i] <= left) {
                if (!kept)
                    fail_msg("trial %d: pair %d-%d of %zu bytes not kept with %zu bytes of "
                             "budget left",
                             trial, i, k, bytes[i], left);
                left -= bytes[i];
            }
            if (kept) kept_bytes += bytes[i];
        }
        if (all) assert_int_equal(kept_bytes, total);
        for (int i = 0; i < n; i++) {
            assert_true(sb[slot[i]] >= bytes[i]);
            for (int j = i + 1; j < n && j <= i + depth; j++)
                if (same[j] != i) assert_int_not_equal(slot[i], slot[j]);
        }
    }
}

static void test_empty_and_single(void **state)
{
    (void)state;
    size_t b = 10, sb[1], lb = 99;
    int slot[1];
    assert_int_equal(etp__plan_tickets(&b, NULL, 0, 1, 0, slot, sb, &lb), 0);
    assert_int_equal(lb, 0);
    assert_int_equal(etp__plan_tickets(&b, NULL, 1, 3, 0, slot, sb, &lb), 1);
    assert_int_equal(sb[0], 10);
    assert_int_equal(lb, 10);
}

/* Tickets of 0 bytes (views of the shard, on a group of one) take no slot;
 * they keep their place in the depth (a gather prefetches the next `depth`
 * tickets, whatever their size): the others within depth of each other
 * still never share a slot, each slot holds its tenants, and the lower
 * bound counts the windows' bytes. */
static void test_zero_byte_tickets(void **state)
{
    (void)state;
    for (int trial = 0; trial < 200; trial++) {
        const int n = 1 + (int)(tu_rand(g_seed, 7, (uint64_t)trial, 0) % 120);
        const int depth = (int)(tu_rand(g_seed, 8, (uint64_t)trial, 0) % 4);
        size_t bytes[128], sb[128], lb = 0, window_max = 0;
        int slot[128];
        for (int i = 0; i < n; i++)
            bytes[i] = tu_rand(g_seed, 9, (uint64_t)trial, (uint64_t)i) % 3 == 0
                           ? 0
                           : 1 + tu_rand(g_seed, 10, (uint64_t)trial, (uint64_t)i) % 5000;
        const int ns = etp__plan_tickets(bytes, NULL, n, depth, 0, slot, sb, &lb);
        assert_true(ns >= 0 && ns <= n);
        for (int i = 0; i < n; i++) {
            size_t w = 0;
            for (int k = i; k < n && k <= i + depth; k++) w += bytes[k];
            if (w > window_max) window_max = w;
            if (bytes[i] == 0) {
                assert_int_equal(slot[i], -1);
                continue;
            }
            assert_true(slot[i] >= 0 && slot[i] < ns);
            assert_true(sb[slot[i]] >= bytes[i]);
            for (int j = i + 1; j < n && j <= i + depth; j++)
                if (bytes[j]) assert_int_not_equal(slot[i], slot[j]);
        }
        assert_int_equal(lb, window_max);
        /* no slot is made for zero-byte tickets alone */
        int any = 0;
        for (int i = 0; i < n; i++) any |= bytes[i] != 0;
        if (!any) assert_int_equal(ns, 0);
    }
}

int main(void)
{
    g_seed = tu_pick_seed();
    printf("test_shard_plan: seed %llu (rerun with ETP_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_sizes_are_optimal),
        cmocka_unit_test(test_random_chains),
        cmocka_unit_test(test_reuse_of_the_same_weight),
        cmocka_unit_test(test_empty_and_single),
        cmocka_unit_test(test_zero_byte_tickets),
        cmocka_unit_test(test_kept_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
