/*
 * Expert parallelism on the CUDA backend (label gpu;ep; 1 and 2 GPUs;
 * skipped without a GPU): the same checked steps as the host MPI test
 * (tests/mpi/test_ep_steps.h: every output bit for bit against the
 * single-rank reference, adjoints, counters, memory report) in the three
 * transports (NVLINK's kernels included), FP32 and BF16 combine wires, both layouts, weighted and not, BF16 and F32, top-k 1, 2, 8;
 * then a forward + backward step in CAPACITY and NVLINK mode captured once into a
 * CUDA graph (T on the device) and replayed with new routing each time,
 * equal bit for bit to the same step run eagerly. MXFP8 dispatch
 * (ETP_EP_TOKEN_MXFP8): the same checked steps with the received data and
 * scales compared byte for byte with the quant module's host reference
 * (so the CUDA quantization equals the host's), top-k 1, 2, 8, both
 * transports and layouts, aligned and misaligned tokens, H with and without
 * wire-row padding; and the captured step with MXFP8 dispatch; and more
 * than 2^16 local experts. Low-latency layers (test_ep_ll.h): the
 * dispatch kernel and combine against the reference and an EXACT group
 * bit for bit, two dispatches in flight, and a captured replay.
 */
#include <cuda_runtime_api.h>

#include "etp/cuda.h"
#include "gpu_util.h"
#define ETP_TEST_EP_MXFP8 1
#include "test_ep_steps.h"

static int setup(void **state)
{
    /* main() has checked that every rank has a GPU of its own */
    ep_fx_t *f = calloc(1, sizeof *f);
    if (f == NULL) return -1;
    etp_context_config_t cfg = ETP_CONTEXT_CONFIG_INIT;
    cfg.backend = ETP_BACKEND_CUDA;
    ETP_OK(etp_context_create_mpi(MPI_COMM_WORLD, &cfg, &f->ctx));
    ETP_OK(etp_context_world(f->ctx, &f->world));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s0));
    ETP_OK(etp_stream_create(f->ctx, ETP_STREAM_PRIORITY_NORMAL, &f->s1));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    ep_fx_t *f = *state;
    if (f->ctx) {
        ETP_OK(etp_stream_destroy(f->s0));
        ETP_OK(etp_stream_destroy(f->s1));
        ETP_OK(etp_context_destroy(f->ctx));
    }
    free(f);
    return 0;
}


#include "test_ep_graph.h"
#include "test_ep_ll.h"

static void test_steps(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 8};
    uint64_t tag = 50000;
    for (int ki = 0; ki < 3; ki++)
        for (int tr = 0; tr < EP_TRANSPORTS; tr++)
            for (int layout = 0; layout < 2; layout++)
                for (int weighted = 0; weighted < 2; weighted++) {
                    int k = ks[ki];
                    etp_dtype_t dt = (ki + tr + layout + weighted) % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
                    /* H: 16-byte rows (vector copies) and odd rows (byte copies), > 256 lanes */
                    int64_t H = (layout + weighted) % 2 ? 1000 : 517;
                    gcfg_t g = cfg_for(k, H, dt, ep_transport(tr));
                    g.cf = weighted ? 1.0 : 4.0;
                    if (dt == ETP_DTYPE_BF16 && ki % 2 == 0) g.wire = ETP_DTYPE_BF16;
                    if (layout == 1 && weighted == 1) { /* rows overflow, >= 2 aligned slots per expert */
                        g.cap = g.cap / 4 / 16 * 16;
                        if (g.cap < 32 * g.L) g.cap = 32 * g.L;
                    }
                    etp_ep_group_t *ep = ep_make_group(f, &g);
                    lcfg_t l = {.k = k, .align = (ki + layout) % 2 ? 16 : 1, .weighted = weighted,
                                .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "gpu");
                    ep_bufs_t b;
                    ep_bufs_alloc(f, &g, l.rows, k, &b);
                    ep_step_opts_t o = {.route_mode = (ki + tr) % 2 ? ROUTE_SKEWED : ROUTE_UNIFORM,
                                        .check_report = 1};
                    ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    o.route_mode = ROUTE_BAD;
                    ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    if (tr) {
                        o.device_T = 1;
                        ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    }
                    ep_bufs_free(f, &b);
                    ETP_OK(etp_ep_layer_destroy(ly));
                    ETP_OK(etp_ep_group_destroy(ep));
                }
}

/* MXFP8 dispatch on the GPU against the host reference, byte for byte. */
static void test_mx_steps(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 8};
    uint64_t tag = 55000;
    for (int ki = 0; ki < 3; ki++)
        for (int tr = 0; tr < EP_TRANSPORTS; tr++)
            for (int layout = 0; layout < 2; layout++)
                for (int weighted = 0; weighted < 2; weighted++) {
                    const int k = ks[ki], v = ki + tr + layout + weighted;
                    /* 1024: 16-byte scale rows (vector copies); 544 = 17 blocks:
                     * byte copies and a padded wire row (561 -> 576 bytes) */
                    const int64_t H = v % 2 ? 1024 : 544;
                    gcfg_t g = cfg_for(k, H, ETP_DTYPE_BF16, ep_transport(tr));
                    g.mx = 1;
                    g.cf = weighted ? 1.0 : 4.0;
                    etp_ep_group_t *ep = ep_make_group(f, &g);
                    lcfg_t l = {.k = k, .align = (ki + layout) % 2 ? 16 : 1, .weighted = weighted,
                                .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                    etp_ep_layer_t *ly = ep_make_layer(ep, &g, &l, "gpu_mx");
                    ep_bufs_t b;
                    ep_bufs_alloc(f, &g, l.rows, k, &b);
                    /* misaligned tokens: the kernel's scalar loads */
                    ep_step_opts_t o = {.route_mode = (ki + tr) % 2 ? ROUTE_SKEWED : ROUTE_UNIFORM,
                                        .check_report = 1, .misalign = (v / 2) % 2};
                    ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    o.route_mode = ROUTE_BAD;
                    ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    if (tr) {
                        o.device_T = 1;
                        ep_step(f, &g, &l, ly, f->s0, &b, tag++, &o);
                    }
                    ep_bufs_free(f, &b);
                    ETP_OK(etp_ep_layer_destroy(ly));
                    ETP_OK(etp_ep_group_destroy(ep));
                }
}

/* More than 2^16 local experts (one layout block per expert in the CUDA
 * layout kernels' grids), checked as on the host backend. */
static void test_many_experts(void **state)
{
    ep_many_experts(*state, 58000);
}

/* Low-latency layers (one dispatch kernel, the NVLINK combine kernel):
 * every output against the reference and an EXACT group's ordinary layer,
 * bit for bit; top-k 1, 2, 8, both layouts, weighted and not, BF16 and
 * F32, 16-byte rows (vector copies) and odd ones (byte copies), both
 * wires, the layer's T the group's or 128; device T; tight capacity; more
 * than 64 local experts. */
static void test_ll_steps(void **state)
{
    ep_fx_t *f = *state;
    const int ks[] = {1, 2, 8};
    uint64_t tag = 70000;
    for (int ki = 0; ki < 3; ki++)
        for (int layout = 0; layout < 2; layout++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const int k = ks[ki], v = ki + layout + weighted;
                const etp_dtype_t dt = v % 2 ? ETP_DTYPE_BF16 : ETP_DTYPE_F32;
                const int64_t H = (layout + weighted) % 2 ? 1024 : 517;
                gcfg_t g = cfg_for(k, H, dt, ETP_EP_TRANSPORT_NVLINK);
                if (dt == ETP_DTYPE_BF16 && ki % 2 == 0) g.wire = ETP_DTYPE_BF16;
                if (layout == 1 && weighted == 1) { /* rows overflow */
                    g.cap = g.cap / 4 / 16 * 16;
                    if (g.cap < 32 * g.L) g.cap = 32 * g.L;
                }
                lcfg_t l = {.k = k, .align = (ki + layout) % 2 ? 16 : 1, .weighted = weighted,
                            .layout = layout ? ETP_EP_LAYOUT_FIXED_SLOTS : ETP_EP_LAYOUT_PACKED};
                const int64_t tll = v % 2 ? 128 : 0; /* 0: the group's 200 */
                const int route = v % 3 == 2 ? ROUTE_BAD : v % 2 ? ROUTE_SKEWED : ROUTE_UNIFORM;
                ll_opts_t o = {.route = route, .exact = 1, .report = 1};
                ll_steps(f, &g, &l, tll, tag, 3, &o);
                o.device_T = 1;
                o.exact = 0;
                ll_steps(f, &g, &l, tll, tag + 10, 2, &o);
                tag += 100;
            }
    /* more local experts than the chunked layout takes (64): the general
     * path of the dispatch kernel */
    gcfg_t g = cfg_for(2, 1024, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_NVLINK);
    g.L = 72;
    g.E = (int64_t)g_size * g.L;
    g.cap = ((int64_t)g_size * g.tmax * 2 + g.L * 16 + 15) / 16 * 16;
    lcfg_t l = {.k = 2, .align = 16, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ll_opts_t o = {.route = ROUTE_UNIFORM, .exact = 1, .report = 1};
    ll_steps(f, &g, &l, 128, tag, 2, &o);
}

/* Two dispatches in flight, the overwrite refusal; a CUDA graph of
 * dispatch + combine replayed with new routing. */
static void test_ll_overlap_graph(void **state)
{
    ep_fx_t *f = *state;
    gcfg_t g = cfg_for(8, 2048, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_NVLINK);
    lcfg_t l = {.k = 8, .align = 16, .weighted = 1, .layout = ETP_EP_LAYOUT_PACKED};
    ll_overlap(f, &g, &l, 128, 75000);
    gcfg_t g2 = cfg_for(8, 2048, ETP_DTYPE_BF16, ETP_EP_TRANSPORT_NVLINK);
    lcfg_t l2 = {.k = 8, .align = 16, .weighted = 1, .layout = ETP_EP_LAYOUT_FIXED_SLOTS};
    ll_graph(f, &g2, &l2, 128, 75100);
    gcfg_t g3 = cfg_for(2, 512, ETP_DTYPE_F32, ETP_EP_TRANSPORT_NVLINK);
    lcfg_t l3 = {.k = 2, .align = 1, .weighted = 0, .layout = ETP_EP_LAYOUT_PACKED};
    ll_graph(f, &g3, &l3, 0, 75200);
}

int main(int argc, char **argv)
{
    tu_mpi_init(&argc, &argv, "test_ep_gpu");
    if (tu_gpu_short("test_ep_gpu")) return tu_gpu_skip();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_mx_steps),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_exact_prepare_in_capture),
        cmocka_unit_test(test_many_experts),
        cmocka_unit_test(test_ll_steps),
        cmocka_unit_test(test_ll_overlap_graph),
    };
    int failed = cmocka_run_group_tests_name("ep_gpu", tests, setup, teardown);
    return tu_mpi_finish(failed);
}
