/* Memory through the context allocator, accounted by owner. */
#include <stdlib.h>

#include "comm_internal.h"

const char *etp_mem_owner_name(etp_mem_owner_t owner)
{
    static const char *const names[ETP_MEM_OWNER_COUNT] = {
        "user", "shards", "main_grad", "gather_slots", "wgrad_ring", "ep_buffers", "workspace"};
    if ((int)owner < 0 || owner >= ETP_MEM_OWNER_COUNT) return "invalid";
    return names[owner];
}

/* Room for one more allocation record (before allocating, so that a
 * failure here leaks nothing). */
static etp_status_t reserve_record(etp_context_t *ctx)
{
    if (ctx->num_allocs < ctx->cap_allocs) return ETP_SUCCESS;
    size_t cap = ctx->cap_allocs ? 2 * ctx->cap_allocs : 16;
    etp__alloc_rec_t *a = realloc(ctx->allocs, cap * sizeof *a);
    if (!a) return etp__err(ETP_ERR_OUT_OF_MEMORY, "etp_mem_alloc: out of host memory");
    ctx->allocs = a;
    ctx->cap_allocs = cap;
    return ETP_SUCCESS;
}

void etp__mem_account(etp_context_t *ctx, etp_mem_owner_t owner, size_t bytes, int add)
{
    if (add) {
        ctx->bytes_by_owner[owner] += bytes;
        ctx->total_bytes += bytes;
        if (ctx->total_bytes > ctx->peak_bytes) ctx->peak_bytes = ctx->total_bytes;
    } else {
        ctx->bytes_by_owner[owner] -= bytes;
        ctx->total_bytes -= bytes;
    }
}

static void record(etp_context_t *ctx, etp__alloc_rec_t r)
{
    ctx->allocs[ctx->num_allocs++] = r;
    ctx->bytes_by_owner[r.owner] += r.bytes;
    ctx->total_bytes += r.bytes;
    if (ctx->total_bytes > ctx->peak_bytes) ctx->peak_bytes = ctx->total_bytes;
}

/* Both backends refuse an allocation during a capture alike, and before
 * anything happens: CUDA's own refusal (thread-local capture mode) would
 * come back as a backend error, and a window's would fail its rendezvous
 * with the other ranks (aborting the context). */
static etp_status_t refuse_in_capture(const etp_context_t *ctx, size_t bytes, etp_mem_owner_t owner)
{
    if (ctx->captures)
        return etp__err(ETP_ERR_INVALID_STATE,
                        "etp_mem_alloc: %zu bytes for %s while a graph capture is in progress on "
                        "this context (allocate before the capture)",
                        bytes, etp_mem_owner_name(owner));
    return ETP_SUCCESS;
}

etp_status_t etp_mem_alloc(etp_context_t *ctx, size_t bytes, etp_mem_owner_t owner, void **ptr)
{
    ETP__CHECK_NULL(ctx, "etp_mem_alloc");
    ETP__CHECK_NULL(ptr, "etp_mem_alloc");
    ETP__CHECK_ARG(bytes > 0, "etp_mem_alloc: bytes is 0");
    ETP__CHECK_ARG((int)owner >= 0 && owner < ETP_MEM_OWNER_COUNT,
                   "etp_mem_alloc: owner %d is not an etp_mem_owner_t", (int)owner);
    ETP__TRY(etp__ctx_usable(ctx, "etp_mem_alloc"));
    ETP__TRY(refuse_in_capture(ctx, bytes, owner));
    ETP__TRY(reserve_record(ctx));
    void *p = NULL;
    if (ctx->allocator.alloc) {
        p = ctx->allocator.alloc(ctx->allocator.user, bytes, owner);
        if (!p)
            return etp__err(ETP_ERR_OUT_OF_MEMORY,
                            "etp_mem_alloc: the user allocator returned NULL for %zu bytes (%s)",
                            bytes, etp_mem_owner_name(owner));
    } else {
        ETP__TRY(ctx->be->ops->mem_alloc(ctx->be, bytes, &p));
    }
    record(ctx, (etp__alloc_rec_t){p, bytes, owner, NULL, 0, NULL});
    ETP__LOG(&ctx->log, ETP_LOG_DEBUG, ETP_SUBSYS_CORE, "alloc %zu bytes for %s at %p", bytes,
             etp_mem_owner_name(owner), p);
    *ptr = p;
    return ETP_SUCCESS;
}

etp_status_t etp__mem_alloc_window(etp_group_t *group, int role, size_t bytes,
                                   etp_mem_owner_t owner, void **ptr, int *window)
{
    etp_context_t *ctx = group->ctx;
    const etp__backend_ops_t *ops = ctx->be->ops;
    *window = 0;
    /* ETP_COPY_ENGINE=0: plain memory (on the host backend too, so that CI
     * runs the chains' plain-memory paths as well). The host backend: any
     * memory is a window. A user allocator: its memory cannot be
     * registered. */
    if (ctx->env.copy_engine == 0) return etp_mem_alloc(ctx, bytes, owner, ptr);
    if (ops->win_alloc == NULL || ctx->allocator.alloc) {
        *window = ops->win_alloc == NULL;
        return etp_mem_alloc(ctx, bytes, owner, ptr);
    }
    ETP__CHECK_ARG(bytes > 0, "etp_mem_alloc: bytes is 0");
    ETP__TRY(etp__ctx_usable(ctx, "etp_mem_alloc"));
    /* registration is collective over the role's communicator */
    ETP__TRY(etp__group_ready(group, 1, "window registration"));
    etp_status_t pre = refuse_in_capture(ctx, bytes, owner);
    if (pre == ETP_SUCCESS) pre = reserve_record(ctx);
    if (pre != ETP_SUCCESS) return etp__group_refused(group, pre, "window registration");
    void *p = NULL, *win = NULL;
    etp_status_t st = ops->win_alloc(ctx->be, group->comms[role], bytes, &p, &win);
    if (st == ETP_ERR_UNSUPPORTED) /* returned without a message: not an error */
        return etp_mem_alloc(ctx, bytes, owner, ptr);
    ETP__TRY(st);
    record(ctx, (etp__alloc_rec_t){p, bytes, owner, group, role, win});
    group->windows++;
    ETP__LOG(&ctx->log, ETP_LOG_DEBUG, ETP_SUBSYS_CORE, "window of %zu bytes for %s at %p (group '%s' role %d)",
             bytes, etp_mem_owner_name(owner), p, group->name, role);
    *ptr = p;
    *window = 1;
    return ETP_SUCCESS;
}

etp_status_t etp_mem_free(etp_context_t *ctx, void *ptr)
{
    ETP__CHECK_NULL(ctx, "etp_mem_free");
    if (!ptr) return ETP_SUCCESS;
    ETP__TRY(etp__ctx_no_capture(ctx, "etp_mem_free"));
    size_t i = 0;
    while (i < ctx->num_allocs && ctx->allocs[i].ptr != ptr) i++;
    if (i == ctx->num_allocs)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "etp_mem_free: %p was not allocated by this context (or was freed already)",
                        ptr);
    /* Like cudaFree: nothing enqueued may still use it. */
    if (!ctx->be->failed) {
        ETP__TRY(ctx->be->ops->device_sync(ctx->be));
        etp__stream_order_waited(ctx, NULL, NULL, 1);
    }
    etp__alloc_rec_t r = ctx->allocs[i];
    ctx->allocs[i] = ctx->allocs[--ctx->num_allocs];
    if (r.win_group) {
        ctx->be->ops->win_free(ctx->be, r.win_group->comms[r.win_role], r.ptr, r.win);
        r.win_group->windows--;
    } else if (ctx->allocator.free)
        ctx->allocator.free(ctx->allocator.user, r.ptr, r.bytes);
    else
        ctx->be->ops->mem_free(ctx->be, r.ptr);
    ctx->bytes_by_owner[r.owner] -= r.bytes;
    ctx->total_bytes -= r.bytes;
    return ETP_SUCCESS;
}

etp_status_t etp_memory_report(const etp_context_t *ctx, etp_memory_report_t *report)
{
    ETP__CHECK_NULL(ctx, "etp_memory_report");
    ETP__CHECK_NULL(report, "etp_memory_report");
    etp_memory_report_t r = ETP_MEMORY_REPORT_INIT;
    for (int i = 0; i < ETP_MEM_OWNER_COUNT; i++) r.bytes[i] = ctx->bytes_by_owner[i];
    r.total_bytes = ctx->total_bytes;
    r.peak_bytes = ctx->peak_bytes;
    r.live_allocations = ctx->num_allocs;
    return etp__vs_out(report, &r, &etp__vs_memory_report, "etp_memory_report", "report");
}
