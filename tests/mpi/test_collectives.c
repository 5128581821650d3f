/*
 * Collectives on the host backend against values each rank computes on its
 * own: every rank can replay any rank's input from the shared seed, so the
 * expected output needs no communication. Run at 2, 3 and 4 ranks, on the
 * world and on a split of uneven sizes with two roles, in eager and shuffle
 * stream modes.
 */
#include "core/half.h"
#include "mpi_util.h"

typedef struct {
    etp_context_t *ctx;
    etp_group_t *world, *split;
    etp_stream_t *s0, *s1;
    int mode;
} fixture_t;

/* The split used here: parity of the world rank, ordered by descending world
 * rank (key = -rank), so group order differs from world order. */
static int split_members(int *members)
{
    int n = 0;
    for (int w = g_size - 1; w >= 0; w--)
        if (w % 2 == g_rank % 2) members[n++] = w;
    return n;
}

static int setup(void **state, int mode)
{
    fixture_t *f = calloc(1, sizeof *f);
    f->mode = mode;
    f->ctx = tu_host_ctx(MPI_COMM_WORLD, mode, (int64_t)(g_seed % 1000), -1, -1);
    ETP_OK(etp_context_world(f->ctx, &f->world));
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = "parity";
    gc.num_roles = 2;
    ETP_OK(etp_group_split(f->world, g_rank % 2, -g_rank, &gc, &f->split));
    assert_non_null(f->split);
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s0));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_HIGH, &f->s1));
    *state = f;
    return 0;
}
static int setup_eager(void **state) { return setup(state, ETP_HOST_STREAMS_EAGER); }
static int setup_shuffle(void **state) { return setup(state, ETP_HOST_STREAMS_SHUFFLE); }

static int teardown(void **state)
{
    fixture_t *f = *state;
    ETP_OK(etp_stream_destroy(f->s0));
    ETP_OK(etp_stream_destroy(f->s1));
    ETP_OK(etp_group_destroy(f->split));
    ETP_OK(etp_context_destroy(f->ctx));
    free(f);
    return 0;
}

/* ---- element access as double (small integers are exact in every type) -- */

static void put(void *buf, etp_dtype_t t, size_t i, double v)
{
    switch (t) {
    case ETP_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case ETP_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ETP_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ETP_DTYPE_F16: ((uint16_t *)buf)[i] = etp__f32_to_f16((float)v); break;
    case ETP_DTYPE_BF16: ((uint16_t *)buf)[i] = etp__f32_to_bf16((float)v); break;
    case ETP_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case ETP_DTYPE_F64: ((double *)buf)[i] = v; break;
    default: fail();
    }
}

static double get(const void *buf, etp_dtype_t t, size_t i)
{
    switch (t) {
    case ETP_DTYPE_U8: return ((const uint8_t *)buf)[i];
    case ETP_DTYPE_I32: return ((const int32_t *)buf)[i];
    case ETP_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case ETP_DTYPE_F16: return etp__f16_to_f32(((const uint16_t *)buf)[i]);
    case ETP_DTYPE_BF16: return etp__bf16_to_f32(((const uint16_t *)buf)[i]);
    case ETP_DTYPE_F32: return ((const float *)buf)[i];
    case ETP_DTYPE_F64: return ((const double *)buf)[i];
    default: fail();
    }
    return 0;
}

/* Input element i of world rank w for test `tid`: an integer that sums
 * exactly in every type (u8 stays small and non-negative). */
static double input(int tid, int w, size_t i, etp_dtype_t t)
{
    uint64_t r = tu_rand(g_seed, (uint64_t)tid, (uint64_t)w, i);
    /* U8 sums stay below 256: MPI leaves overflow to the implementation (Open
     * MPI's vectorized reductions saturate at 255 from 8 ranks on) */
    if (t == ETP_DTYPE_U8) return (double)(r % (uint64_t)(255 / g_size + 1));
    return (double)((int64_t)(r % 17) - 8);
}

static const etp_dtype_t all_types[] = {ETP_DTYPE_U8,   ETP_DTYPE_I32, ETP_DTYPE_I64,
                                        ETP_DTYPE_F16,  ETP_DTYPE_BF16, ETP_DTYPE_F32,
                                        ETP_DTYPE_F64};
#define NTYPES (sizeof all_types / sizeof all_types[0])

/* Members (world ranks in group order) of the group used by variant v. */
static int members_of(int v, int *m)
{
    if (v == 0) {
        for (int w = 0; w < g_size; w++) m[w] = w;
        return g_size;
    }
    return split_members(m);
}

static void sync_all(fixture_t *f)
{
    ETP_OK(etp_stream_synchronize(f->s0));
    ETP_OK(etp_stream_synchronize(f->s1));
}

static void check_group_shape(fixture_t *f)
{
    int m[64] = {0}, n = split_members(m), rank = -1, size = -1, roles = -1;
    ETP_OK(etp_group_rank(f->split, &rank));
    ETP_OK(etp_group_size(f->split, &size));
    ETP_OK(etp_group_num_roles(f->split, &roles));
    assert_int_equal(size, n);
    assert_int_equal(roles, 2);
    assert_int_equal(m[rank], g_rank);
    assert_string_equal(etp_group_name(f->split), "parity");
}

static void test_allgather(void **state)
{
    fixture_t *f = *state;
    check_group_shape(f);
    const size_t counts[] = {0, 1, 7, 1000};
    for (int v = 0; v < 2; v++) {
        int m[64] = {0}, n = members_of(v, m), me = 0;
        while (m[me] != g_rank) me++;
        etp_group_t *g = v ? f->split : f->world;
        etp_stream_t *s = v ? f->s1 : f->s0;
        int role = v; /* the split's second role */
        for (size_t ti = 0; ti < NTYPES; ti++)
            for (size_t ci = 0; ci < 4; ci++) {
                etp_dtype_t t = all_types[ti];
                size_t c = counts[ci], es = etp_dtype_size(t);
                int tid = (int)(100 * v + 10 * ti + ci);
                uint8_t *send = malloc(c * es + 1), *recv = malloc((size_t)n * c * es + 1);
                for (size_t i = 0; i < c; i++) put(send, t, i, input(tid, g_rank, i, t));
                tu_poison(recv, (size_t)n * c * es);
                ETP_OK(etp_allgather(g, role, send, recv, c, t, s));
                sync_all(f);
                for (int j = 0; j < n; j++)
                    for (size_t i = 0; i < c; i++)
                        assert_true(get(recv, t, (size_t)j * c + i) == input(tid, m[j], i, t));
                /* in place: this rank's block already sits in recv */
                tu_poison(recv, (size_t)n * c * es);
                for (size_t i = 0; i < c; i++) put(recv + (size_t)me * c * es, t, i, input(tid, g_rank, i, t));
                ETP_OK(etp_allgather(g, role, recv + (size_t)me * c * es, recv, c, t, s));
                sync_all(f);
                for (int j = 0; j < n; j++)
                    for (size_t i = 0; i < c; i++)
                        assert_true(get(recv, t, (size_t)j * c + i) == input(tid, m[j], i, t));
                free(send);
                free(recv);
            }
    }
}

static double reduce(etp_redop_t op, etp_dtype_t t, int tid, const int *m, int n, size_t i)
{
    double acc = input(tid, m[0], i, t);
    for (int j = 1; j < n; j++) {
        double x = input(tid, m[j], i, t);
        acc = op == ETP_REDOP_SUM ? acc + x : (x > acc ? x : acc);
    }
    return acc;
}

static void test_reduce_scatter_and_allreduce(void **state)
{
    fixture_t *f = *state;
    const size_t counts[] = {0, 1, 33, 500};
    for (int v = 0; v < 2; v++) {
        int m[64] = {0}, n = members_of(v, m), me = 0;
        while (m[me] != g_rank) me++;
        etp_group_t *g = v ? f->split : f->world;
        etp_stream_t *s = v ? f->s1 : f->s0;
        for (size_t ti = 0; ti < NTYPES; ti++)
            for (int op = 0; op < 2; op++)
                for (size_t ci = 0; ci < 4; ci++) {
                    etp_dtype_t t = all_types[ti];
                    size_t c = counts[ci], es = etp_dtype_size(t), total = c * (size_t)n;
                    int tid = (int)(1000 + 100 * v + 20 * ti + 10 * op + ci);
                    uint8_t *send = malloc(total * es + 1), *recv = malloc(total * es + 1);
                    for (size_t i = 0; i < total; i++) put(send, t, i, input(tid, g_rank, i, t));
                    /* reduce-scatter */
                    tu_poison(recv, total * es);
                    ETP_OK(etp_reduce_scatter(g, v, send, recv, c, t, (etp_redop_t)op, s));
                    sync_all(f);
                    for (size_t i = 0; i < c; i++)
                        assert_true(get(recv, t, i) ==
                                    reduce((etp_redop_t)op, t, tid, m, n, (size_t)me * c + i));
                    /* the bytes past this rank's block stay untouched */
                    for (size_t b = c * es; b < total * es; b++) assert_int_equal(recv[b], 0xA5);
                    /* all-reduce, out of place then in place */
                    tu_poison(recv, total * es);
                    ETP_OK(etp_allreduce(g, 0, send, recv, total, t, (etp_redop_t)op, s));
                    sync_all(f);
                    for (size_t i = 0; i < total; i++)
                        assert_true(get(recv, t, i) == reduce((etp_redop_t)op, t, tid, m, n, i));
                    ETP_OK(etp_allreduce(g, 0, send, send, total, t, (etp_redop_t)op, s));
                    sync_all(f);
                    for (size_t i = 0; i < total; i++)
                        assert_true(get(send, t, i) == reduce((etp_redop_t)op, t, tid, m, n, i));
                    free(send);
                    free(recv);
                }
    }
}

/* Elements world rank a sends to world rank b in test tid: uneven, some 0. */
static size_t a2a_count(int tid, int a, int b)
{
    return (size_t)(tu_rand(g_seed, (uint64_t)tid, (uint64_t)(a * 64 + b), 99) % 9);
}

static void test_alltoallv(void **state)
{
    fixture_t *f = *state;
    for (int v = 0; v < 2; v++) {
        int m[64] = {0}, n = members_of(v, m);
        etp_group_t *g = v ? f->split : f->world;
        etp_stream_t *s = v ? f->s1 : f->s0;
        for (size_t ti = 0; ti < NTYPES; ti++) {
            etp_dtype_t t = all_types[ti];
            size_t es = etp_dtype_size(t);
            int tid = (int)(5000 + 100 * v + ti);
            size_t sc[64], sd[64], rc[64], rd[64], stot = 0, rtot = 0;
            /* blocks laid out with a one-element gap that must stay poisoned */
            for (int p = 0; p < n; p++) {
                sc[p] = a2a_count(tid, g_rank, m[p]);
                sd[p] = stot;
                stot += sc[p] + 1;
                rc[p] = a2a_count(tid, m[p], g_rank);
                rd[p] = rtot;
                rtot += rc[p] + 1;
            }
            uint8_t *send = malloc(stot * es + 1), *recv = malloc(rtot * es + 1);
            for (int p = 0; p < n; p++)
                for (size_t i = 0; i < sc[p]; i++)
                    put(send, t, sd[p] + i, input(tid, g_rank * 64 + m[p], i, t));
            tu_poison(recv, rtot * es);
            ETP_OK(etp_alltoallv(g, v, send, sc, sd, recv, rc, rd, t, s));
            /* The count arrays are the caller's again once the call returns. */
            memset(sc, 0xff, sizeof sc);
            memset(rc, 0xff, sizeof rc);
            sync_all(f);
            for (int p = 0; p < n; p++) {
                size_t cnt = a2a_count(tid, m[p], g_rank);
                for (size_t i = 0; i < cnt; i++)
                    assert_true(get(recv, t, rd[p] + i) == input(tid, m[p] * 64 + g_rank, i, t));
                for (size_t b = 0; b < es; b++) assert_int_equal(recv[(rd[p] + cnt) * es + b], 0xA5);
            }
            free(send);
            free(recv);
        }
    }
}

/* One way: rank 0 sends to rank 1 and receives nothing (recv NULL), rank 1
 * receives and sends nothing (send NULL), the others neither. */
static void test_alltoallv_one_way(void **state)
{
    fixture_t *f = *state;
    if (g_size < 2) skip();
    size_t sc[64] = {0}, sd[64] = {0}, rc[64] = {0}, rd[64] = {0};
    float out[5], in[5];
    for (int i = 0; i < 5; i++) out[i] = (float)input(6000, 0, (size_t)i, ETP_DTYPE_F32);
    tu_poison(in, sizeof in);
    if (g_rank == 0) sc[1] = 5;
    if (g_rank == 1) rc[0] = 5;
    ETP_OK(etp_alltoallv(f->world, 0, g_rank == 0 ? out : NULL, sc, sd, g_rank == 1 ? in : NULL, rc, rd,
                         ETP_DTYPE_F32, f->s0));
    sync_all(f);
    if (g_rank == 1)
        for (int i = 0; i < 5; i++) assert_true(in[i] == out[i]);
}

/* A pipeline over two streams ordered only by events, and a batch: what
 * the shard engine will do (gather on one stream, consume on another). */
static void test_streams_events_batch(void **state)
{
    fixture_t *f = *state;
    int m[64] = {0}, n = members_of(1, m);
    const size_t c = 64;
    int tid = 7000;
    float *stage = malloc(c * sizeof(float)), *src = malloc(c * sizeof(float));
    float *gathered = malloc((size_t)n * c * sizeof(float)), *copy = malloc((size_t)n * c * sizeof(float));
    float *sum = malloc(c * sizeof(float));
    for (size_t i = 0; i < c; i++) src[i] = (float)input(tid, g_rank, i, ETP_DTYPE_F32);
    tu_poison(stage, c * sizeof(float));
    tu_poison(gathered, (size_t)n * c * sizeof(float));
    tu_poison(copy, (size_t)n * c * sizeof(float));
    tu_poison(sum, c * sizeof(float));
    etp_event_t *staged, *got;
    ETP_OK(etp_event_create(f->ctx, &staged));
    ETP_OK(etp_event_create(f->ctx, &got));
    /* s0 stages the input; s1 gathers it (role 1) and all-reduces (role 0) in
     * one batch; s0 copies the gathered result after the event. */
    ETP_OK(etp_memcpy_async(f->s0, stage, src, c * sizeof(float)));
    ETP_OK(etp_event_record(staged, f->s0));
    ETP_OK(etp_stream_wait_event(f->s1, staged));
    ETP_OK(etp_batch_begin(f->ctx));
    ETP_OK(etp_allgather(f->split, 1, stage, gathered, c, ETP_DTYPE_F32, f->s1));
    ETP_OK(etp_allreduce(f->split, 0, stage, sum, c, ETP_DTYPE_F32, ETP_REDOP_SUM, f->s1));
    ETP_OK(etp_batch_end(f->ctx));
    ETP_OK(etp_event_record(got, f->s1));
    ETP_OK(etp_stream_wait_event(f->s0, got));
    ETP_OK(etp_memcpy_async(f->s0, copy, gathered, (size_t)n * c * sizeof(float)));
    ETP_OK(etp_stream_synchronize(f->s0));
    int done = 0;
    ETP_OK(etp_event_query(got, &done));
    assert_int_equal(done, 1);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < c; i++)
            assert_true(copy[(size_t)j * c + i] == (float)input(tid, m[j], i, ETP_DTYPE_F32));
    for (size_t i = 0; i < c; i++)
        assert_true(sum[i] == (float)reduce(ETP_REDOP_SUM, ETP_DTYPE_F32, tid, m, n, i));
    ETP_OK(etp_event_destroy(staged));
    ETP_OK(etp_event_destroy(got));
    free(stage);
    free(src);
    free(gathered);
    free(copy);
    free(sum);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_collectives");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_reduce_scatter_and_allreduce),
        cmocka_unit_test(test_alltoallv),
        cmocka_unit_test(test_alltoallv_one_way),
        cmocka_unit_test(test_streams_events_batch),
    };
    int failed = cmocka_run_group_tests_name("eager", tests, setup_eager, teardown);
    failed += cmocka_run_group_tests_name("shuffle", tests, setup_shuffle, teardown);
    return tu_mpi_finish(failed);
}
