/* etp-train's model on etp (model.h). */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static etp_status_t alloc0(train_model_t *m, size_t bytes, void **p)
{
    if (bytes == 0) bytes = 256;
    TRY(etp_mem_alloc(m->ctx, bytes, ETP_MEM_USER, p));
    TRY(etp_memset_async(m->s, *p, 0, bytes));
    return ETP_SUCCESS;
}

#define ALLOC(m, ptr, bytes) alloc0((m), (bytes), (void **)&(ptr))

const char *model__weight_name(train_weight_t w)
{
    static const char *names[TRAIN_WEIGHTS] = {"wp", "wr", "w1", "w2"};
    return names[w];
}

/* ---- timing ------------------------------------------------------------- */

/* Events around a call on the stream: the stream's time inside it is what
 * the call left exposed (a gather's wait for its prefetch, an EP call's
 * exchange). CUDA and eager only. */
static void mark(train_model_t *m, int kind)
{
#if ETP_HAVE_CUDA
    if (!m->o.timing || m->backend != ETP_BACKEND_CUDA || m->nev >= m->cap_ev) return;
    cudaEventRecord(m->ev[m->nev], m->cs);
    m->ev_kind[m->nev] = kind;
    m->nev++;
#else
    (void)m, (void)kind;
#endif
}

/* ---- parameters ----------------------------------------------------------- */

static tparam_t *P(train_model_t *m, int layer, train_weight_t w)
{
    return &m->params[layer * TRAIN_WEIGHTS + w];
}

/* The replicas' sum of a parameter's main_grad: an all-gather and a sum in
 * group-rank order (moe_sum) rather than an all-reduce, whose order is the
 * library's: the result is then the same on every backend and split, and
 * the reference can follow it (docs/TRAINING.md). */
static void grad_ready(void *user, etp_param_t *param, etp_stream_t *final_stream)
{
    tparam_t *tp = user;
    train_model_t *m = tp->m;
    (void)param;
    if (!tp->reduce_group) return;
    /* A failure here surfaces at the next synchronization of the stream:
     * the callback has no way to return it. */
    etp_status_t st = etp_allgather(tp->reduce_group, 0, tp->info.main_grad, m->replica_buf,
                                    (size_t)tp->n, ETP_DTYPE_F32, final_stream);
    if (st == ETP_SUCCESS)
        st = moe_sum(m->ops, final_stream, m->replica_buf, tp->reduce_size, tp->n,
                     tp->info.main_grad);
    if (st != ETP_SUCCESS)
        fprintf(stderr, "etp-train: gradient reduction of %s over its replicas: %s\n",
                tp->info.name, etp_last_error());
}

static etp_status_t make_param(train_model_t *m, int layer, train_weight_t w)
{
    tparam_t *tp = P(m, layer, w);
    int64_t e, r, c;
    train_weight_shape(&m->sh, w, &e, &r, &c);
    tp->m = m;
    tp->kind = w;
    tp->layer = layer;
    tp->experts = e > 1 ? m->E_local : 1;
    tp->expert0 = e > 1 ? (int64_t)m->r_ep * m->E_local : 0;
    tp->rows = r;
    tp->cols = c;
    char name[32];
    snprintf(name, sizeof name, "l%d.%s", layer, model__weight_name(w));
    etp_param_config_t pc = ETP_PARAM_CONFIG_INIT;
    pc.name = name;
    pc.group = m->g_etp;
    pc.experts = tp->experts;
    pc.rows = r;
    pc.cols = c;
    pc.dtype = ETP_DTYPE_BF16;
    pc.wgrad_dtype = ETP_DTYPE_F32;
    pc.master = 1;
    if (m->sh.quant != TRAIN_QUANT_NONE) {
        pc.quant = m->sh.quant == TRAIN_QUANT_MXFP8 ? ETP_PARAM_QUANT_MXFP8 : ETP_PARAM_QUANT_NVFP4;
        pc.alignment = m->sh.quant == TRAIN_QUANT_MXFP8 ? 32 : 16;
        pc.gather_dequantized = 1;
    }
    TRY(etp_param_create(m->ctx, &pc, &tp->p));
    etp_param_info_t info = ETP_PARAM_INFO_INIT;
    TRY(etp_param_info(tp->p, &info));
    tp->info = info;
    tp->n = info.experts * info.shard_rows * info.cols;
    TRY(ALLOC(m, tp->adam_m, (size_t)tp->n * sizeof(float)));
    TRY(ALLOC(m, tp->adam_v, (size_t)tp->n * sizeof(float)));
    int size = 1;
    tp->reduce_group = e > 1 ? m->g_dp : m->g_edp;
    TRY(etp_group_size(tp->reduce_group, &size));
    if (size == 1) tp->reduce_group = NULL;
    tp->reduce_size = size;
    size_t rb = (size_t)size * (size_t)tp->n * sizeof(float);
    if (size > 1 && rb > m->replica_bytes) m->replica_bytes = rb;
    TRY(etp_param_set_grad_callback(tp->p, grad_ready, tp));
    if (m->o.resident)
        TRY(ALLOC(m, tp->whole, (size_t)(tp->experts * r * c) * 2));
    size_t fb = (size_t)tp->n * 2;
    if (fb > m->fill_bytes) m->fill_bytes = fb;
    return ETP_SUCCESS;
}

/* The weight for a product: a gather through the chain, or the resident copy. */
static etp_status_t get_weight(train_model_t *m, tparam_t *tp, etp_pass_t pass,
                               etp_weight_view_t *v)
{
    if (m->o.resident) {
        etp_weight_view_t r = ETP_WEIGHT_VIEW_INIT;
        r.data = tp->whole;
        r.dtype = ETP_DTYPE_BF16;
        r.experts = tp->experts;
        r.rows = tp->rows;
        r.cols = tp->cols;
        r.ld = tp->cols;
        r.expert_stride = tp->rows * tp->cols;
        *v = r;
        return ETP_SUCCESS;
    }
    const etp_weight_view_t init = ETP_WEIGHT_VIEW_INIT;
    *v = init;
    mark(m, 0);
    etp_status_t st = etp_gather(tp->p, pass, m->s, v);
    mark(m, 0);
    return st;
}

static etp_status_t put_weight(train_model_t *m, tparam_t *tp, etp_pass_t pass)
{
    if (m->o.resident) return ETP_SUCCESS;
    return etp_release(tp->p, pass, m->s);
}

/* ---- GEMMs ------------------------------------------------------------------ */

static etp_status_t make_plans(train_model_t *m)
{
    for (int w = 0; w < TRAIN_WEIGHTS; w++) {
        tparam_t *tp = P(m, 0, (train_weight_t)w);
        for (int op = 0; op < P_COUNT; op++) {
            etp_gemm_config_t gc = ETP_GEMM_CONFIG_INIT;
            char name[32];
            snprintf(name, sizeof name, "%s.%s", model__weight_name((train_weight_t)w),
                     op == P_FWD ? "fwd" : op == P_DGRAD ? "dgrad" : "wgrad");
            gc.name = name;
            gc.op = op == P_FWD ? ETP_GEMM_FORWARD : op == P_DGRAD ? ETP_GEMM_DGRAD : ETP_GEMM_WGRAD;
            gc.n = tp->rows;
            gc.k = tp->cols;
            gc.weight_ld = tp->cols;
            /* gathers and wgrad buffers keep each expert's padded rows; the
             * resident copies are whole tensors without padding */
            gc.weight_expert_stride =
                (m->o.resident && op != P_WGRAD ? tp->rows : tp->info.padded_rows) * tp->cols;
            gc.out_dtype = ETP_DTYPE_BF16;
            if (op == P_WGRAD || (w == TRAIN_WR && op == P_FWD)) gc.out_dtype = ETP_DTYPE_F32;
            if (w == TRAIN_WP || w == TRAIN_WR) {
                gc.layout = ETP_GEMM_DENSE;
                gc.experts = 1;
                gc.rows = m->T;
            } else if (m->o.transport == ETP_EP_TRANSPORT_EXACT) {
                gc.layout = ETP_GEMM_PACKED;
                gc.experts = m->E_local;
                gc.rows = m->rows;
            } else {
                gc.layout = ETP_GEMM_FIXED_SLOTS;
                gc.experts = m->E_local;
                gc.rows = m->S;
            }
            TRY(etp_gemm_plan_create(m->ctx, &gc, &m->plan[w][op]));
        }
    }
    return ETP_SUCCESS;
}

static etp_status_t gemm(train_model_t *m, train_weight_t w, int op, const tlayer_t *L,
                         const void *in_a, const void *in_b, const etp_weight_view_t *wv,
                         void *out)
{
    etp_gemm_args_t a = ETP_GEMM_ARGS_INIT;
    switch (op) {
    case P_FWD: a.x = in_a, a.w = wv, a.y = out; break;
    case P_DGRAD: a.dy = in_a, a.w = wv, a.dx = out; break;
    default: a.dy = in_a, a.x = in_b, a.dw = wv; break;
    }
    if ((w == TRAIN_W1 || w == TRAIN_W2) && m->o.transport == ETP_EP_TRANSPORT_EXACT) {
        a.counts = L->counts;
        a.offsets = L->offsets;
    }
    return etp_gemm_run(m->plan[w][op], &a, m->s);
}

/* dW of (layer, w) into the chain's wgrad buffer and its reduction. */
static etp_status_t wgrad(train_model_t *m, int layer, train_weight_t w, const void *dy,
                          const void *x)
{
    tparam_t *tp = P(m, layer, w);
    etp_weight_view_t dv = ETP_WEIGHT_VIEW_INIT;
    TRY(etp_wgrad_buffer(tp->p, m->s, &dv));
    TRY(gemm(m, w, P_WGRAD, &m->layers[layer], dy, x, &dv, NULL));
    TRY(etp_reduce_grad(tp->p, m->s, 1.0f));
    return ETP_SUCCESS;
}

/* ---- creation ---------------------------------------------------------------- */

static etp_status_t split(train_model_t *m, int color, int key, int roles, const char *name,
                          etp_group_t **g)
{
    etp_group_config_t gc = ETP_GROUP_CONFIG_INIT;
    gc.name = name;
    gc.num_roles = roles;
    TRY(etp_group_split(m->world, color, key, &gc, g));
    return ETP_SUCCESS;
}

static etp_status_t make_ep(train_model_t *m)
{
    const train_shape_t *sh = &m->sh;
    int k = sh->topk;
    int64_t kl = k < m->E_local ? k : m->E_local;
    int R = m->o.ep;
    etp_ep_group_config_t gc = ETP_EP_GROUP_CONFIG_INIT;
    gc.name = "ep";
    gc.num_experts = sh->experts;
    gc.hidden = sh->hidden;
    gc.token_dtype = ETP_DTYPE_BF16;
    gc.max_tokens_per_rank = sh->tokens;
    gc.max_topk = k;
    gc.transport = m->o.transport;
    gc.overflow = ETP_EP_OVERFLOW_DROP;
    gc.combine_wire = m->o.combine_wire ? m->o.combine_wire : ETP_DTYPE_F32;
    const int align = m->o.transport == ETP_EP_TRANSPORT_EXACT ? 1 : 16;
    if (m->o.capacity <= 0) {
        /* every token of the group on every local expert it can pick */
        m->S = (int64_t)R * sh->tokens;
        m->S = (m->S + align - 1) / align * align;
        gc.recv_capacity_per_rank = m->o.transport == ETP_EP_TRANSPORT_EXACT
                                        ? (int64_t)R * sh->tokens * kl
                                        : m->S * m->E_local;
        gc.capacity_factor = 1e9; /* slabs of max_tokens_per_rank: nothing dropped */
    } else {
        double mean_expert = (double)R * sh->tokens * k / sh->experts;
        m->S = (int64_t)(m->o.capacity * mean_expert + 0.999);
        m->S = (m->S + align - 1) / align * align;
        if (m->S < align) m->S = align;
        gc.recv_capacity_per_rank = m->o.transport == ETP_EP_TRANSPORT_EXACT
                                        ? (int64_t)(m->o.capacity * sh->tokens * k + 0.999)
                                        : m->S * m->E_local;
        gc.capacity_factor = m->o.capacity;
    }
    m->recv_tokens = gc.recv_capacity_per_rank < (int64_t)R * sh->tokens ? gc.recv_capacity_per_rank
                                                                         : (int64_t)R * sh->tokens;
    TRY(etp_ep_group_create(m->g_ep, &gc, &m->epg));
    for (int l = 0; l < sh->layers; l++) {
        etp_ep_layer_config_t lc = ETP_EP_LAYER_CONFIG_INIT;
        char name[16];
        snprintf(name, sizeof name, "moe%d", l);
        lc.name = name;
        lc.topk = k;
        lc.weighted = 1;
        if (m->o.transport == ETP_EP_TRANSPORT_EXACT) {
            lc.layout = ETP_EP_LAYOUT_PACKED;
            lc.alignment = 1;
        } else {
            lc.layout = ETP_EP_LAYOUT_FIXED_SLOTS;
            lc.alignment = align;
            lc.slots_per_expert = m->S;
        }
        TRY(etp_ep_layer_create(m->epg, &lc, &m->layers[l].ep));
    }
    TRY(etp_ep_layer_rows(m->layers[0].ep, &m->rows));
    return ETP_SUCCESS;
}

static etp_status_t make_buffers(train_model_t *m)
{
    const train_shape_t *sh = &m->sh;
    const size_t TH = (size_t)(m->T * sh->hidden) * 2, TE = (size_t)(m->T * sh->experts);
    const size_t Tk = (size_t)(m->T * sh->topk);
    const size_t RH = (size_t)(m->rows * sh->hidden) * 2, RF = (size_t)(m->rows * sh->ffn) * 2;
    for (int l = 0; l < sh->layers; l++) {
        tlayer_t *L = &m->layers[l];
        TRY(ALLOC(m, L->x, TH));
        TRY(ALLOC(m, L->u, TH));
        TRY(ALLOC(m, L->probs, TE * 4));
        TRY(ALLOC(m, L->idx, Tk * 8));
        TRY(ALLOC(m, L->w, Tk * 4));
        TRY(ALLOC(m, L->recv, RH));
        TRY(ALLOC(m, L->a, RF));
        TRY(ALLOC(m, L->s, RF));
        TRY(ALLOC(m, L->o, RH));
        L->counts = calloc((size_t)m->E_local, sizeof(int32_t));
        L->offsets = calloc((size_t)m->E_local + 1, sizeof(int32_t));
        if (!L->counts || !L->offsets) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    m->x_in = m->layers[0].x;
    TRY(ALLOC(m, m->y_last, TH));
    TRY(ALLOC(m, m->target, TH));
    TRY(ALLOC(m, m->pool_x, TH * (size_t)sh->pool));
    TRY(ALLOC(m, m->pool_t, TH * (size_t)sh->pool));
    TRY(ALLOC(m, m->t_p, TH));
    TRY(ALLOC(m, m->t_m, TH));
    TRY(ALLOC(m, m->g, TH));
    TRY(ALLOC(m, m->gu, TH));
    TRY(ALLOC(m, m->gq, TH));
    TRY(ALLOC(m, m->gm, TH));
    TRY(ALLOC(m, m->gp, TH));
    TRY(ALLOC(m, m->z, TE * 4));
    TRY(ALLOC(m, m->dz, TE * 2));
    TRY(ALLOC(m, m->gw, Tk * 4));
    TRY(ALLOC(m, m->go, RH));
    TRY(ALLOC(m, m->gr, RH));
    TRY(ALLOC(m, m->gs, RF));
    TRY(ALLOC(m, m->ga, RF));
    TRY(ALLOC(m, m->loss_dev, sizeof(double)));
    TRY(ALLOC(m, m->replica_buf, m->replica_bytes));
    m->loss_host = calloc(1, sizeof(double));
    if (!m->loss_host) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    return ETP_SUCCESS;
}

etp_status_t model_check_opts(const train_opts_t *o, int ranks, char *why, size_t n)
{
    const train_shape_t *sh = &o->shape;
#define REFUSE(...)                                                                        \
    do {                                                                                   \
        snprintf(why, n, __VA_ARGS__);                                                     \
        return ETP_ERR_INVALID_ARGUMENT;                                                   \
    } while (0)
    if (o->etp < 1 || o->ep < 1 || o->dp < 1 || o->etp * o->ep * o->dp != ranks)
        REFUSE("--etp %d x --ep %d x --dp %d must be the %d ranks", o->etp, o->ep, o->dp, ranks);
    if (sh->ep != o->ep) REFUSE("the shape's EP size %d is not --ep %d", sh->ep, o->ep);
    if (sh->experts % o->ep != 0)
        REFUSE("--experts %d is not a multiple of the EP size %d", sh->experts, o->ep);
    if (sh->topk > sh->experts)
        REFUSE("--topk %d is more than --experts %d", sh->topk, sh->experts);
    if (sh->quant != TRAIN_QUANT_NONE && (sh->hidden % 32 || sh->ffn % 32))
        REFUSE("with --quant, --hidden and --ffn must be multiples of 32 (the MXFP8 block)");
    for (int r = 0; r < ranks; r++)
        if (train_tokens(sh, r) < 1)
            REFUSE("rank %d would have %lld tokens (--tokens %lld - (%d %% 3) x --tokens-step "
                   "%lld)",
                   r, (long long)train_tokens(sh, r), (long long)sh->tokens, r,
                   (long long)sh->tokens_step);
    if (o->transport != ETP_EP_TRANSPORT_EXACT && o->transport != ETP_EP_TRANSPORT_CAPACITY &&
        o->transport != ETP_EP_TRANSPORT_NVLINK)
        REFUSE("transport %d is not exact, capacity or nvlink", (int)o->transport);
    if (o->combine_wire != 0 && o->combine_wire != ETP_DTYPE_F32 &&
        o->combine_wire != ETP_DTYPE_BF16)
        REFUSE("combine wire %d is not f32 or bf16", (int)o->combine_wire);
    if (o->keep_bytes && o->resident)
        REFUSE("--keep keeps gathered weights; --resident gathers none");
    if (o->keep_bytes && sh->quant != TRAIN_QUANT_NONE)
        REFUSE("--keep keeps unquantized gathers; with --quant every gather quantizes again");
    if (o->graph && o->transport == ETP_EP_TRANSPORT_EXACT)
        REFUSE("--graph needs the capacity or nvlink transport (exact copies the counts to the "
               "host at every layer)");
#undef REFUSE
    return ETP_SUCCESS;
}

etp_status_t model_create(etp_context_t *ctx, etp_stream_t *s, const train_opts_t *o,
                          train_model_t **out)
{
    train_model_t *m = calloc(1, sizeof *m);
    if (!m) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    *out = m; /* model_destroy frees what was made, even on failure */
    m->ctx = ctx;
    m->s = s;
    m->o = *o;
    m->sh = o->shape;
    const train_shape_t *sh = &m->sh;
    TRY(etp_context_backend(ctx, &m->backend));
    TRY(etp_context_rank(ctx, &m->rank));
    TRY(etp_context_size(ctx, &m->ranks));
    char why[256];
    if (model_check_opts(o, m->ranks, why, sizeof why) != ETP_SUCCESS)
        FAIL(ETP_ERR_INVALID_ARGUMENT, "%s", why);
    m->r_etp = m->rank % o->etp;
    m->r_ep = (m->rank / o->etp) % o->ep;
    m->r_dp = m->rank / (o->etp * o->ep);
    m->T = train_tokens(sh, m->rank);
    for (int r = 0; r < m->ranks; r++) m->N += train_tokens(sh, r);
    m->E_local = sh->experts / o->ep;
#if ETP_HAVE_CUDA
    if (m->backend == ETP_BACKEND_CUDA) {
        TRY(etp_stream_get_cuda(s, &m->cs));
        if (cudaEventCreate(&m->ev_begin) != cudaSuccess ||
            cudaEventCreate(&m->ev_end) != cudaSuccess ||
            cudaEventCreate(&m->ev_opt) != cudaSuccess)
            FAIL(ETP_ERR_BACKEND, "cudaEventCreate failed");
        if (o->timing) {
            m->cap_ev = sh->layers * 32 + 8;
            m->ev = calloc((size_t)m->cap_ev, sizeof *m->ev);
            m->ev_kind = calloc((size_t)m->cap_ev, sizeof *m->ev_kind);
            if (!m->ev || !m->ev_kind) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
            for (int i = 0; i < m->cap_ev; i++)
                if (cudaEventCreate(&m->ev[i]) != cudaSuccess)
                    FAIL(ETP_ERR_BACKEND, "cudaEventCreate failed");
        }
    }
#endif
    TRY(etp_context_world(ctx, &m->world));
    TRY(split(m, m->r_dp * o->ep + m->r_ep, m->r_etp, 2, "etp", &m->g_etp));
    TRY(split(m, m->r_dp * o->etp + m->r_etp, m->r_ep, 1, "ep", &m->g_ep));
    TRY(split(m, m->r_ep * o->etp + m->r_etp, m->r_dp, 1, "dp", &m->g_dp));
    TRY(split(m, m->r_etp, m->r_dp * o->ep + m->r_ep, 1, "edp", &m->g_edp));
    TRY(moe_ops_create(ctx, 4096, &m->ops));
    m->params = calloc((size_t)sh->layers * TRAIN_WEIGHTS, sizeof *m->params);
    m->layers = calloc((size_t)sh->layers, sizeof *m->layers);
    if (!m->params || !m->layers) FAIL(ETP_ERR_OUT_OF_MEMORY, "out of host memory");
    TRY(make_ep(m));
    etp_chain_config_t cc = ETP_CHAIN_CONFIG_INIT;
    cc.name = "layers";
    cc.group = m->g_etp;
    cc.depth = o->depth;
    cc.keep_bytes = o->keep_bytes;
    cc.graphed = o->graph;
    /* model_step captures forward and backward in one graph */
    cc.graph_whole_step = o->graph;
    cc.ag_role = 0;
    cc.rs_role = 1;
    TRY(etp_chain_create(ctx, &cc, &m->chain));
    for (int l = 0; l < sh->layers; l++)
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            TRY(make_param(m, l, (train_weight_t)w));
            TRY(etp_chain_add(m->chain, P(m, l, (train_weight_t)w)->p));
        }
    TRY(etp_chain_finalize(m->chain));
    TRY(make_buffers(m));
    TRY(make_plans(m));
    TRY(etp_stream_synchronize(s));
    return ETP_SUCCESS;
}

void model_destroy(train_model_t *m)
{
    if (!m) return;
    if (m->s) etp_stream_synchronize(m->s);
    etp_graph_destroy(m->graph);
    for (int w = 0; w < TRAIN_WEIGHTS; w++)
        for (int op = 0; op < P_COUNT; op++) etp_gemm_plan_destroy(m->plan[w][op]);
    if (m->chain) etp_chain_destroy(m->chain);
    if (m->layers)
        for (int l = 0; l < m->sh.layers; l++) {
            tlayer_t *L = &m->layers[l];
            etp_ep_layer_destroy(L->ep);
            void *bufs[] = {L->x, L->u, L->probs, L->idx, L->w, L->recv, L->a, L->s, L->o};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
                if (bufs[i]) etp_mem_free(m->ctx, bufs[i]);
            free(L->counts);
            free(L->offsets);
        }
    if (m->params)
        for (int i = 0; i < m->sh.layers * TRAIN_WEIGHTS; i++) {
            tparam_t *tp = &m->params[i];
            etp_param_destroy(tp->p);
            void *bufs[] = {tp->adam_m, tp->adam_v, tp->whole};
            for (size_t j = 0; j < 3; j++)
                if (bufs[j]) etp_mem_free(m->ctx, bufs[j]);
        }
    etp_ep_group_destroy(m->epg);
    void *bufs[] = {m->y_last, m->target, m->pool_x, m->pool_t, m->t_p, m->t_m, m->g,
                    m->gu, m->gq, m->gm, m->gp, m->z, m->dz, m->gw, m->go, m->gr,
                    m->gs, m->ga, m->loss_dev, m->fill_buf, m->replica_buf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) etp_mem_free(m->ctx, bufs[i]);
    moe_ops_destroy(m->ops);
    etp_group_destroy(m->g_edp);
    etp_group_destroy(m->g_dp);
    etp_group_destroy(m->g_ep);
    etp_group_destroy(m->g_etp);
#if ETP_HAVE_CUDA
    if (m->backend == ETP_BACKEND_CUDA) {
        cudaEventDestroy(m->ev_begin);
        cudaEventDestroy(m->ev_end);
        cudaEventDestroy(m->ev_opt);
        for (int i = 0; i < m->cap_ev && m->ev; i++) cudaEventDestroy(m->ev[i]);
    }
    free(m->ev);
    free(m->ev_kind);
#endif
    free(m->params);
    free(m->layers);
    free(m->loss_host);
    free(m);
}

/* ---- weights and data ---------------------------------------------------------- */

/* The staging of weight initialization and checkpoint loads, only while
 * they run: at the largest sizes a step's peak has no room to spare for it. */
etp_status_t model__fill_begin(train_model_t *m)
{
    if (!m->fill_buf) TRY(ALLOC(m, m->fill_buf, m->fill_bytes));
    return ETP_SUCCESS;
}

etp_status_t model__fill_end(train_model_t *m)
{
    void *b = m->fill_buf;
    m->fill_buf = NULL;
    /* etp_mem_free waits for the loads that read it */
    return b ? etp_mem_free(m->ctx, b) : ETP_SUCCESS;
}

/* The resident copies: every weight whole, from the shards. */
etp_status_t model__refresh_resident(train_model_t *m)
{
    if (!m->o.resident) return ETP_SUCCESS;
    for (int i = 0; i < m->sh.layers * TRAIN_WEIGHTS; i++)
        TRY(etp_param_export_full(m->params[i].p, m->params[i].whole, m->s));
    return ETP_SUCCESS;
}

etp_status_t model_init_weights(train_model_t *m, int teacher)
{
    TRY(model__fill_begin(m));
    for (int l = 0; l < m->sh.layers; l++)
        for (int w = 0; w < TRAIN_WEIGHTS; w++) {
            tparam_t *tp = P(m, l, (train_weight_t)w);
            moe_fill_t f = {0};
            f.seed = m->sh.seed;
            f.tensor = train_tensor_weight(l, (train_weight_t)w, teacher);
            f.experts = tp->experts;
            f.rows = tp->info.shard_rows;
            f.cols = tp->cols;
            f.expert0 = tp->expert0;
            f.row0 = tp->info.shard_row_begin;
            f.valid_rows = tp->info.valid_shard_rows;
            f.total_rows = tp->rows;
            f.scale = train_weight_scale(&m->sh, (train_weight_t)w, teacher);
            TRY(moe_fill_normal(m->ops, m->s, m->fill_buf, &f));
            TRY(etp_param_load_shard(tp->p, m->fill_buf, m->s));
            TRY(etp_memset_async(m->s, tp->adam_m, 0, (size_t)tp->n * 4));
            TRY(etp_memset_async(m->s, tp->adam_v, 0, (size_t)tp->n * 4));
        }
    TRY(model__fill_end(m));
    m->t = 0;
    TRY(model__refresh_resident(m));
    TRY(etp_stream_synchronize(m->s));
    moe_ops_rewind(m->ops, 0);
    return ETP_SUCCESS;
}

/* ---- forward and backward ------------------------------------------------------ */

static etp_status_t forward(train_model_t *m)
{
    const train_shape_t *sh = &m->sh;
    const int64_t TH = m->T * sh->hidden;
    for (int l = 0; l < sh->layers; l++) {
        tlayer_t *L = &m->layers[l];
        uint16_t *x_next = l + 1 < sh->layers ? m->layers[l + 1].x : m->y_last;
        etp_weight_view_t v;
        tparam_t *wp = P(m, l, TRAIN_WP), *wr = P(m, l, TRAIN_WR);
        tparam_t *w1 = P(m, l, TRAIN_W1), *w2 = P(m, l, TRAIN_W2);

        TRY(get_weight(m, wp, ETP_PASS_FORWARD, &v));
        TRY(gemm(m, TRAIN_WP, P_FWD, L, L->x, NULL, &v, m->t_p));
        TRY(put_weight(m, wp, ETP_PASS_FORWARD));
        TRY(moe_add(m->ops, m->s, L->x, m->t_p, NULL, L->u, TH));

        TRY(get_weight(m, wr, ETP_PASS_FORWARD, &v));
        TRY(gemm(m, TRAIN_WR, P_FWD, L, L->u, NULL, &v, m->z));
        TRY(put_weight(m, wr, ETP_PASS_FORWARD));
        TRY(moe_router_fwd(m->ops, m->s, m->z, m->T, sh->experts, sh->topk, L->probs, L->idx,
                           L->w));

        mark(m, 1);
        TRY(etp_ep_prepare(L->ep, L->idx, ETP_DTYPE_I64, m->T, NULL, m->s));
        TRY(etp_ep_dispatch(L->ep, L->u, ETP_DTYPE_BF16, L->w, ETP_DTYPE_F32, L->recv, NULL,
                            m->rows, m->s));
        if (m->o.transport == ETP_EP_TRANSPORT_EXACT)
            TRY(etp_ep_layout_host(L->ep, m->s, L->counts, L->offsets));
        mark(m, 1);

        TRY(get_weight(m, w1, ETP_PASS_FORWARD, &v));
        TRY(gemm(m, TRAIN_W1, P_FWD, L, L->recv, NULL, &v, L->a));
        TRY(put_weight(m, w1, ETP_PASS_FORWARD));
        TRY(moe_silu_fwd(m->ops, m->s, L->a, L->s, m->rows * sh->ffn));
        TRY(get_weight(m, w2, ETP_PASS_FORWARD, &v));
        TRY(gemm(m, TRAIN_W2, P_FWD, L, L->s, NULL, &v, L->o));
        TRY(put_weight(m, w2, ETP_PASS_FORWARD));

        mark(m, 1);
        TRY(etp_ep_combine(L->ep, L->o, ETP_DTYPE_BF16, m->rows, m->t_m, m->s));
        mark(m, 1);
        TRY(moe_add(m->ops, m->s, L->u, m->t_m, NULL, x_next, TH));
    }
    return ETP_SUCCESS;
}

/* From m->g = dL/dy, every weight gradient reduced into main_grad. */
static etp_status_t backward(train_model_t *m)
{
    const train_shape_t *sh = &m->sh;
    const int64_t TH = m->T * sh->hidden;
    for (int l = sh->layers - 1; l >= 0; l--) {
        tlayer_t *L = &m->layers[l];
        etp_weight_view_t v;
        tparam_t *wp = P(m, l, TRAIN_WP), *wr = P(m, l, TRAIN_WR);
        tparam_t *w1 = P(m, l, TRAIN_W1), *w2 = P(m, l, TRAIN_W2);

        mark(m, 1);
        TRY(etp_ep_combine_bwd(L->ep, m->g, ETP_DTYPE_BF16, L->o, m->rows, m->go, m->gw, m->s));
        mark(m, 1);

        TRY(get_weight(m, w2, ETP_PASS_BACKWARD, &v));
        TRY(gemm(m, TRAIN_W2, P_DGRAD, L, m->go, NULL, &v, m->gs));
        TRY(put_weight(m, w2, ETP_PASS_BACKWARD));
        TRY(wgrad(m, l, TRAIN_W2, m->go, L->s));
        TRY(moe_silu_bwd(m->ops, m->s, L->a, m->gs, m->ga, m->rows * sh->ffn));

        TRY(get_weight(m, w1, ETP_PASS_BACKWARD, &v));
        TRY(gemm(m, TRAIN_W1, P_DGRAD, L, m->ga, NULL, &v, m->gr));
        TRY(put_weight(m, w1, ETP_PASS_BACKWARD));
        TRY(wgrad(m, l, TRAIN_W1, m->ga, L->recv));

        mark(m, 1);
        TRY(etp_ep_dispatch_bwd(L->ep, m->gr, ETP_DTYPE_BF16, NULL, m->rows, m->gm, NULL, m->s));
        mark(m, 1);
        TRY(moe_router_bwd(m->ops, m->s, L->probs, L->idx, m->gw, m->T, sh->experts, sh->topk,
                           m->dz));

        TRY(get_weight(m, wr, ETP_PASS_BACKWARD, &v));
        TRY(gemm(m, TRAIN_WR, P_DGRAD, L, m->dz, NULL, &v, m->gq));
        TRY(put_weight(m, wr, ETP_PASS_BACKWARD));
        TRY(wgrad(m, l, TRAIN_WR, m->dz, L->u));
        TRY(moe_add(m->ops, m->s, m->g, m->gm, m->gq, m->gu, TH));

        TRY(get_weight(m, wp, ETP_PASS_BACKWARD, &v));
        TRY(gemm(m, TRAIN_WP, P_DGRAD, L, m->gu, NULL, &v, m->gp));
        TRY(put_weight(m, wp, ETP_PASS_BACKWARD));
        TRY(wgrad(m, l, TRAIN_WP, m->gu, L->x));
        if (l > 0) TRY(moe_add(m->ops, m->s, m->gu, m->gp, NULL, m->g, TH));
    }
    return ETP_SUCCESS;
}

static etp_status_t fwd_bwd(train_model_t *m)
{
    const int64_t TH = m->T * m->sh.hidden;
    TRY(etp_zero_grad(m->chain, m->s));
    TRY(forward(m));
    TRY(moe_mse(m->ops, m->s, m->y_last, m->target, TH, train_loss_scale(m->N, m->sh.hidden), m->g,
                m->loss_dev));
    TRY(etp_allreduce(m->world, 0, m->loss_dev, m->loss_dev, 1, ETP_DTYPE_F64, ETP_REDOP_SUM,
                      m->s));
    TRY(backward(m));
    TRY(etp_wait_grads(m->chain, m->s));
    return ETP_SUCCESS;
}

static etp_status_t optimizer(train_model_t *m)
{
    m->t++;
    moe_adam_t a = train_adam(&m->sh, m->t);
    for (int i = 0; i < m->sh.layers * TRAIN_WEIGHTS; i++) {
        tparam_t *tp = &m->params[i];
        TRY(moe_adam(m->ops, m->s, &a, tp->info.main_grad, tp->adam_m, tp->adam_v,
                     tp->info.master, tp->info.shard, tp->n));
        TRY(etp_param_mark_updated(tp->p, m->s));
    }
    return ETP_SUCCESS;
}

static etp_status_t load_batch(train_model_t *m, int batch)
{
    const size_t TH = (size_t)(m->T * m->sh.hidden) * 2;
    int b = batch % m->sh.pool;
    TRY(etp_memcpy_async(m->s, m->x_in, (const char *)m->pool_x + TH * (size_t)b, TH));
    TRY(etp_memcpy_async(m->s, m->target, (const char *)m->pool_t + TH * (size_t)b, TH));
    return ETP_SUCCESS;
}

static void collect_times(train_model_t *m)
{
#if ETP_HAVE_CUDA
    if (m->backend == ETP_BACKEND_CUDA) {
        float ms = 0;
        cudaEventElapsedTime(&ms, m->ev_begin, m->ev_end);
        m->times.fwdbwd_ms = ms;
        cudaEventElapsedTime(&ms, m->ev_end, m->ev_opt);
        m->times.optim_ms = ms;
        double g = 0, x = 0;
        for (int i = 0; i + 1 < m->nev; i += 2) {
            cudaEventElapsedTime(&ms, m->ev[i], m->ev[i + 1]);
            if (m->ev_kind[i] == 0)
                g += ms;
            else
                x += ms;
        }
        m->times.gather_ms = g;
        m->times.exchange_ms = x;
        m->nev = 0;
    }
#else
    (void)m;
#endif
}

/* m->dropped: the slots every layer's EP reports dropped since its
 * creation (the stream synchronized). */
static etp_status_t poll_dropped(train_model_t *m)
{
    int64_t d = 0;
    for (int l = 0; l < m->sh.layers; l++) {
        etp_ep_report_t r = ETP_EP_REPORT_INIT;
        TRY(etp_ep_poll(m->layers[l].ep, &r));
        d += r.transport_dropped_slots + r.rows_dropped_slots + r.bad_index_slots +
             r.duplicate_slots;
    }
    m->dropped = d;
    return ETP_SUCCESS;
}

etp_status_t model_step(train_model_t *m, int batch, int capture, double *loss)
{
    double t0 = now_ms();
    if (m->graph) moe_ops_rewind(m->ops, m->rec_mark);
    else moe_ops_rewind(m->ops, 0);
    TRY(load_batch(m, batch));
#if ETP_HAVE_CUDA
    m->nev = 0;
    if (m->backend == ETP_BACKEND_CUDA) cudaEventRecord(m->ev_begin, m->cs);
#endif
    if (m->graph) {
        TRY(etp_graph_launch(m->graph, m->s));
    } else if (capture) {
        int timing = m->o.timing;
        m->o.timing = 0; /* no events inside the graph */
        TRY(etp_stream_begin_capture(m->s));
        etp_status_t st = fwd_bwd(m);
        etp_graph_t *g = NULL;
        etp_status_t st2 = etp_stream_end_capture(m->s, &g);
        m->o.timing = timing;
        TRY(st);
        TRY(st2);
        m->graph = g;
        m->rec_mark = moe_ops_mark(m->ops);
        TRY(etp_graph_launch(m->graph, m->s));
    } else {
        TRY(fwd_bwd(m));
    }
#if ETP_HAVE_CUDA
    if (m->backend == ETP_BACKEND_CUDA) cudaEventRecord(m->ev_end, m->cs);
#endif
    double t1 = now_ms();
    TRY(optimizer(m));
#if ETP_HAVE_CUDA
    if (m->backend == ETP_BACKEND_CUDA) cudaEventRecord(m->ev_opt, m->cs);
#endif
    TRY(etp_memcpy_async(m->s, m->loss_host, m->loss_dev, sizeof(double)));
    TRY(etp_stream_synchronize(m->s));
    double t2 = now_ms();
    TRY(model__refresh_resident(m));
    if (m->o.resident) TRY(etp_stream_synchronize(m->s));
    *loss = *m->loss_host / ((double)m->N * (double)m->sh.hidden);
    const int64_t before = m->dropped;
    TRY(poll_dropped(m));
    memset(&m->times, 0, sizeof m->times);
    m->times.step_ms = t2 - t0;
    m->times.fwdbwd_ms = t1 - t0; /* host: replaced by events on CUDA */
    collect_times(m);
    m->times.dropped = m->dropped;
    m->times.dropped_step = m->dropped - before;
    return ETP_SUCCESS;
}

etp_status_t model_make_data(train_model_t *m)
{
    const train_shape_t *sh = &m->sh;
    const size_t TH = (size_t)(m->T * sh->hidden) * 2;
    int64_t first = 0;
    for (int r = 0; r < m->rank; r++) first += train_tokens(sh, r);
    for (int b = 0; b < sh->pool; b++) {
        moe_fill_t f = {0};
        f.seed = sh->seed;
        f.tensor = train_tensor_input(b);
        f.experts = 1;
        f.rows = m->T;
        f.cols = sh->hidden;
        f.row0 = first;
        f.valid_rows = m->T;
        f.total_rows = m->N;
        f.scale = 1.0f;
        TRY(moe_fill_normal(m->ops, m->s, (uint16_t *)((char *)m->pool_x + TH * (size_t)b), &f));
    }
    TRY(model_init_weights(m, 1));
    /* whole steps without the optimizer: the chain's gathers keep their
     * forward-then-backward order (the targets are still zero: the
     * gradients are thrown away) */
    for (int b = 0; b < sh->pool; b++) {
        moe_ops_rewind(m->ops, 0);
        TRY(load_batch(m, b));
        TRY(fwd_bwd(m));
        TRY(etp_memcpy_async(m->s, (char *)m->pool_t + TH * (size_t)b, m->y_last, TH));
        TRY(etp_stream_synchronize(m->s));
    }
    TRY(etp_stream_synchronize(m->s));
    return poll_dropped(m); /* the teacher's drops are no step's */
}

void model_times(const train_model_t *m, train_times_t *t)
{
    *t = m->times;
}

int model_step_count(const train_model_t *m)
{
    return m->t;
}

void model_ep_limits(const train_model_t *m, int64_t *recv_tokens, int64_t *slots)
{
    *recv_tokens = m->recv_tokens;
    *slots = m->o.transport == ETP_EP_TRANSPORT_EXACT ? 0 : m->S;
}

size_t model_max_shard_bytes(const train_model_t *m)
{
    return m->fill_bytes * 2;
}

etp_status_t model_grad_shard(train_model_t *m, int layer, train_weight_t w, float *dst,
                              int64_t *expert0, int64_t *experts, int64_t *row0,
                              int64_t *valid_rows, int64_t *shard_rows)
{
    tparam_t *tp = P(m, layer, w);
    TRY(etp_memcpy_async(m->s, dst, tp->info.main_grad, (size_t)tp->n * 4));
    TRY(etp_stream_synchronize(m->s));
    *expert0 = tp->expert0;
    *experts = tp->experts;
    *row0 = tp->info.shard_row_begin;
    *valid_rows = tp->info.valid_shard_rows;
    *shard_rows = tp->info.shard_rows;
    return ETP_SUCCESS;
}
