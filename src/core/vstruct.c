/*
 * Versioned public structs: which sizes of a caller's struct etp accepts,
 * copying in (configs) and out (reports, infos, views). The layouts of every
 * public struct that starts with a size field are listed here, in field
 * order: add a field to the header, add it here.
 */
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "etp/comm.h"
#include "etp/ep.h"
#include "etp/gemm.h"
#include "etp/param.h"
#include "etp/quant.h"

etp_status_t etp__vs_check(size_t size, const etp__vstruct_t *vs, const char *fn, const char *arg)
{
    if (size == vs->size) return ETP_SUCCESS;
    if (size > vs->size)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s->size %zu is larger than %s of this etp (%zu bytes): built against "
                        "a newer etp header? (initialize with %s)",
                        fn, arg, size, vs->type, vs->size, vs->init);
    /* no struct of any version held nothing but its size */
    if (size <= vs->fields[1].offset)
        return etp__err(ETP_ERR_INVALID_ARGUMENT,
                        "%s: %s->size %zu holds no field after the size (this etp's %s is %zu "
                        "bytes; initialize with %s)",
                        fn, arg, size, vs->type, vs->size, vs->init);
    /* An older caller's struct ends after one of the fields, maybe with the
     * padding up to the next (its sizeof); any other size cuts a field. */
    for (size_t i = 1; i < vs->nfields; i++) {
        const etp__field_t *f = &vs->fields[i];
        if (size < f->end) {
            if (size > f->offset)
                return etp__err(ETP_ERR_INVALID_ARGUMENT,
                                "%s: %s->size %zu ends inside field '%s' (bytes %zu to %zu) of %s: "
                                "a size must end after a field (this etp's %s is %zu bytes; "
                                "initialize with %s)",
                                fn, arg, size, f->name, f->offset, f->end, vs->type, vs->type,
                                vs->size, vs->init);
            return ETP_SUCCESS; /* in the padding before field i */
        }
    }
    return ETP_SUCCESS; /* in the padding after the last field */
}

etp_status_t etp__vs_in(void *dst, const void *src, const etp__vstruct_t *vs, const char *fn,
                        const char *arg)
{
    if (src == NULL) return ETP_SUCCESS;
    const size_t size = *(const size_t *)src;
    ETP__TRY(etp__vs_check(size, vs, fn, arg));
    memcpy(dst, src, size);
    *(size_t *)dst = vs->size;
    return ETP_SUCCESS;
}

void etp__vs_put(void *dst, const void *src)
{
    const size_t size = *(const size_t *)dst;
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), size - sizeof(size_t));
}

etp_status_t etp__vs_out(void *dst, const void *src, const etp__vstruct_t *vs, const char *fn,
                         const char *arg)
{
    ETP__TRY(etp__vs_check(*(const size_t *)dst, vs, fn, arg));
    etp__vs_put(dst, src);
    return ETP_SUCCESS;
}

/* ---- the layouts ------------------------------------------------------------ */

#define F(f) ETP__FIELD(etp_context_config_t, f)
static const etp__field_t context_config_fields[] = {
    F(size), F(backend), F(device), F(host_stream_mode), F(shuffle_seed), F(timeout_s),
    F(check_collectives), F(allocator), F(log_fn), F(log_user)};
#undef F
const etp__vstruct_t etp__vs_context_config =
    ETP__VSTRUCT(etp_context_config_t, ETP_CONTEXT_CONFIG_INIT, context_config_fields);

#define F(f) ETP__FIELD(etp_memory_report_t, f)
static const etp__field_t memory_report_fields[] = {
    F(size), F(bytes), F(total_bytes), F(peak_bytes), F(live_allocations)};
#undef F
const etp__vstruct_t etp__vs_memory_report =
    ETP__VSTRUCT(etp_memory_report_t, ETP_MEMORY_REPORT_INIT, memory_report_fields);

#define F(f) ETP__FIELD(etp_group_config_t, f)
static const etp__field_t group_config_fields[] = {
    F(size), F(name), F(num_roles), F(min_ctas), F(max_ctas), F(cga_cluster_size),
    F(cta_policy)};
#undef F
const etp__vstruct_t etp__vs_group_config =
    ETP__VSTRUCT(etp_group_config_t, ETP_GROUP_CONFIG_INIT, group_config_fields);

#define F(f) ETP__FIELD(etp_param_config_t, f)
static const etp__field_t param_config_fields[] = {
    F(size), F(name), F(group), F(experts), F(rows), F(cols), F(dtype), F(wgrad_dtype),
    F(upcast_wgrad), F(alignment), F(master), F(quant), F(gather_dequantized),
    F(swizzle_scales), F(cache_gathered_scales)};
#undef F
const etp__vstruct_t etp__vs_param_config =
    ETP__VSTRUCT(etp_param_config_t, ETP_PARAM_CONFIG_INIT, param_config_fields);

#define F(f) ETP__FIELD(etp_param_info_t, f)
static const etp__field_t param_info_fields[] = {
    F(size), F(name), F(experts), F(rows), F(cols), F(padded_rows), F(shard_rows),
    F(shard_row_begin), F(valid_shard_rows), F(dtype), F(wgrad_dtype), F(shard), F(main_grad),
    F(master)};
#undef F
const etp__vstruct_t etp__vs_param_info =
    ETP__VSTRUCT(etp_param_info_t, ETP_PARAM_INFO_INIT, param_info_fields);

#define F(f) ETP__FIELD(etp_chain_config_t, f)
static const etp__field_t chain_config_fields[] = {
    F(size), F(name), F(group), F(depth), F(graphed), F(ag_role), F(rs_role), F(wgrad_ring),
    F(num_microbatches), F(prefetch_on_update), F(defer_zero_grad), F(graph_whole_step),
    F(keep_bytes)};
#undef F
const etp__vstruct_t etp__vs_chain_config =
    ETP__VSTRUCT(etp_chain_config_t, ETP_CHAIN_CONFIG_INIT, chain_config_fields);

#define F(f) ETP__FIELD(etp_cache_report_t, f)
static const etp__field_t cache_report_fields[] = {
    F(size), F(tickets), F(slots), F(slot_bytes), F(lower_bound_bytes), F(wgrad_ring_bytes)};
#undef F
const etp__vstruct_t etp__vs_cache_report =
    ETP__VSTRUCT(etp_cache_report_t, ETP_CACHE_REPORT_INIT, cache_report_fields);

#define F(f) ETP__FIELD(etp_weight_view_t, f)
static const etp__field_t weight_view_fields[] = {
    F(size), F(data), F(dtype), F(experts), F(rows), F(cols), F(ld), F(expert_stride), F(quant),
    F(scales), F(scale_rows), F(scale_cols), F(scale_expert_stride), F(amax),
    F(scales_swizzled)};
#undef F
const etp__vstruct_t etp__vs_weight_view =
    ETP__VSTRUCT(etp_weight_view_t, ETP_WEIGHT_VIEW_INIT, weight_view_fields);

#define F(f) ETP__FIELD(etp_quantizer_config_t, f)
static const etp__field_t quantizer_config_fields[] = {
    F(size), F(format), F(mxfp8_elem), F(nvfp4_block), F(directions), F(swizzle_scales),
    F(rounding), F(seed), F(noop_flag)};
#undef F
const etp__vstruct_t etp__vs_quantizer_config =
    ETP__VSTRUCT(etp_quantizer_config_t, ETP_QUANTIZER_CONFIG_INIT, quantizer_config_fields);

#define F(f) ETP__FIELD(etp_quant_sizes_t, f)
static const etp__field_t quant_sizes_fields[] = {
    F(size), F(rowwise_data_bytes), F(rowwise_scale_rows), F(rowwise_scale_cols),
    F(rowwise_scales_bytes), F(columnwise_data_bytes), F(columnwise_scale_rows),
    F(columnwise_scale_cols), F(columnwise_scales_bytes)};
#undef F
const etp__vstruct_t etp__vs_quant_sizes =
    ETP__VSTRUCT(etp_quant_sizes_t, ETP_QUANT_SIZES_INIT, quant_sizes_fields);

#define F(f) ETP__FIELD(etp_ep_group_config_t, f)
static const etp__field_t ep_group_config_fields[] = {
    F(size), F(name), F(role), F(num_experts), F(hidden), F(token_dtype),
    F(max_tokens_per_rank), F(max_topk), F(recv_capacity_per_rank), F(overflow), F(transport),
    F(capacity_factor), F(combine_wire), F(num_sms)};
#undef F
const etp__vstruct_t etp__vs_ep_group_config =
    ETP__VSTRUCT(etp_ep_group_config_t, ETP_EP_GROUP_CONFIG_INIT, ep_group_config_fields);

#define F(f) ETP__FIELD(etp_ep_group_info_t, f)
static const etp__field_t ep_group_info_fields[] = {
    F(size), F(rank), F(ranks), F(local_experts), F(first_expert), F(slab_rows),
    F(recv_token_rows), F(send_token_rows), F(buffer_bytes), F(wire_row_bytes), F(transport),
    F(combine_wire), F(num_sms)};
#undef F
const etp__vstruct_t etp__vs_ep_group_info =
    ETP__VSTRUCT(etp_ep_group_info_t, ETP_EP_GROUP_INFO_INIT, ep_group_info_fields);

#define F(f) ETP__FIELD(etp_ep_layer_config_t, f)
static const etp__field_t ep_layer_config_fields[] = {
    F(size), F(name), F(topk), F(alignment), F(layout), F(weighted), F(slots_per_expert),
    F(low_latency), F(max_tokens_per_rank)};
#undef F
const etp__vstruct_t etp__vs_ep_layer_config =
    ETP__VSTRUCT(etp_ep_layer_config_t, ETP_EP_LAYER_CONFIG_INIT, ep_layer_config_fields);

#define F(f) ETP__FIELD(etp_ep_dispatch_args_t, f)
static const etp__field_t ep_dispatch_args_fields[] = {
    F(size), F(tokens), F(dtype), F(topk_weights), F(weights_dtype), F(recv_tokens),
    F(recv_scales), F(recv_weights), F(rows)};
#undef F
const etp__vstruct_t etp__vs_ep_dispatch_args =
    ETP__VSTRUCT(etp_ep_dispatch_args_t, ETP_EP_DISPATCH_ARGS_INIT, ep_dispatch_args_fields);

#define F(f) ETP__FIELD(etp_ep_ll_dispatch_args_t, f)
static const etp__field_t ep_ll_dispatch_args_fields[] = {
    F(size), F(topk_idx), F(idx_dtype), F(num_tokens), F(num_tokens_dev), F(tokens), F(dtype),
    F(topk_weights), F(weights_dtype)};
#undef F
const etp__vstruct_t etp__vs_ep_ll_dispatch_args = ETP__VSTRUCT(
    etp_ep_ll_dispatch_args_t, ETP_EP_LL_DISPATCH_ARGS_INIT, ep_ll_dispatch_args_fields);

#define F(f) ETP__FIELD(etp_ep_ll_rows_t, f)
static const etp__field_t ep_ll_rows_fields[] = {F(size),    F(tokens), F(weights), F(counts),
                                                 F(offsets), F(rows),   F(half)};
#undef F
const etp__vstruct_t etp__vs_ep_ll_rows =
    ETP__VSTRUCT(etp_ep_ll_rows_t, ETP_EP_LL_ROWS_INIT, ep_ll_rows_fields);

#define F(f) ETP__FIELD(etp_ep_report_t, f)
static const etp__field_t ep_report_fields[] = {
    F(size), F(flags), F(bad_index_slots), F(duplicate_slots), F(transport_dropped_slots),
    F(rows_dropped_slots), F(transport_rows_needed), F(rows_needed), F(prepares)};
#undef F
const etp__vstruct_t etp__vs_ep_report =
    ETP__VSTRUCT(etp_ep_report_t, ETP_EP_REPORT_INIT, ep_report_fields);

#define F(f) ETP__FIELD(etp_gemm_config_t, f)
static const etp__field_t gemm_config_fields[] = {
    F(size), F(name), F(op), F(layout), F(experts), F(rows), F(n), F(k), F(weight_ld),
    F(weight_expert_stride), F(out_dtype), F(workspace_bytes)};
#undef F
const etp__vstruct_t etp__vs_gemm_config =
    ETP__VSTRUCT(etp_gemm_config_t, ETP_GEMM_CONFIG_INIT, gemm_config_fields);

#define F(f) ETP__FIELD(etp_gemm_args_t, f)
static const etp__field_t gemm_args_fields[] = {
    F(size), F(x), F(dy), F(w), F(y), F(dx), F(dw), F(beta), F(counts), F(offsets)};
#undef F
const etp__vstruct_t etp__vs_gemm_args =
    ETP__VSTRUCT(etp_gemm_args_t, ETP_GEMM_ARGS_INIT, gemm_args_fields);
