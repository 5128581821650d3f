/*
 * etp/trace.h - trace points: a callback of the caller's at the phase
 * boundaries inside etp calls, so that a profiler or a benchmark can time
 * each phase (record an event on the call's stream at each point) without
 * etp timing anything itself.
 *
 * A module offers a setter for its objects (etp_ep_group_set_trace in
 * etp/ep.h); etp then calls the callback, while a call of that object
 * enqueues its work, at each point of the call listed below, with the
 * stream the next phase runs on.
 *
 * The callback:
 * - runs on the calling thread, inside the etp call, at enqueue time: an
 *   event recorded on `stream` at a point completes when the work enqueued
 *   before the point has, and before the work after it starts (all phases of
 *   one call run on its stream, in order);
 * - when the call is being captured into a graph, runs once, as the call is
 *   captured (what it records on the stream becomes part of the graph);
 *   replays of the graph (etp_graph_launch) call nothing;
 * - may record events on `stream` (etp_event_record, or cudaEventRecord on
 *   the CUDA stream under it), read host clocks, and, outside a capture,
 *   synchronize `stream`; it must not call functions of the module that
 *   reported the point (those of the same EP group that enqueue work or
 *   change its objects are refused with ETP_ERR_INVALID_STATE), nor enqueue
 *   other work on `stream`;
 * - returns nothing: its own errors are its business.
 *
 * Points are reported in the order listed for each call, each at most once
 * per call. A transport or kernel that fuses phases reports only the points
 * it still has (the first and the last point of a call are always there);
 * new points may be added to this enum in later versions, so a callback
 * should ignore points it does not know.
 */
#ifndef ETP_TRACE_H
#define ETP_TRACE_H

#include "etp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum etp_trace_point {
    /* etp_ep_dispatch and etp_ep_dispatch_ex (after the wait for the EP
     * group's previous call on another stream, if any):
     * | pack (token side: copy or MXFP8-quantize each token once per
     * destination rank) | exchange (token rows and weights to the expert
     * ranks) | expand (received rows into the layer's layout) | */
    ETP_TRACE_EP_DISPATCH_PACK = 0x100,     /* before the pack */
    ETP_TRACE_EP_DISPATCH_EXCHANGE = 0x101, /* after the pack, before the exchange */
    ETP_TRACE_EP_DISPATCH_EXPAND = 0x102,   /* after the exchange, before the expand */
    ETP_TRACE_EP_DISPATCH_END = 0x103,      /* after the expand: the call's last work */
    /* etp_ep_combine: | pre-sum (expert side: each token's rows summed per
     * rank, FP32) | exchange (the partials back to the token ranks) | sum
     * (token side: partials summed in rank order, rounded once) | */
    ETP_TRACE_EP_COMBINE_PRESUM = 0x110,    /* before the pre-sum */
    ETP_TRACE_EP_COMBINE_EXCHANGE = 0x111,  /* after the pre-sum, before the exchange */
    ETP_TRACE_EP_COMBINE_SUM = 0x112,       /* after the exchange, before the sum */
    ETP_TRACE_EP_COMBINE_END = 0x113,       /* after the sum: the call's last work */
    /* etp_ep_dispatch_bwd: the phases of combine (unweighted), with the
     * weight gradients gathered in the pre-sum phase and scattered to the
     * slots in the sum phase when they are asked for */
    ETP_TRACE_EP_DISPATCH_BWD_PRESUM = 0x120,
    ETP_TRACE_EP_DISPATCH_BWD_EXCHANGE = 0x121,
    ETP_TRACE_EP_DISPATCH_BWD_SUM = 0x122,
    ETP_TRACE_EP_DISPATCH_BWD_END = 0x123,
    /* etp_ep_prepare: | route (token side: each slot's destination, each
     * copy's position in its destination's rows) | exchange (the counts
     * and the routing rows to the expert ranks) | layout (expert side: the
     * received rows laid out per local expert) | */
    ETP_TRACE_EP_PREPARE_ROUTE = 0x130,    /* before the route */
    ETP_TRACE_EP_PREPARE_EXCHANGE = 0x131, /* after the route, before the exchange */
    ETP_TRACE_EP_PREPARE_LAYOUT = 0x132,   /* after the exchange, before the layout */
    ETP_TRACE_EP_PREPARE_END = 0x133       /* after the layout: the call's last work */
} etp_trace_point_t;

/* A trace callback: `user` as given to the setter, the point, and the
 * stream of the call (the caller's; the phases after the point run on it). */
typedef void (*etp_trace_fn_t)(void *user, etp_trace_point_t point, etp_stream_t *stream);

#ifdef __cplusplus
}
#endif

#endif /* ETP_TRACE_H */
