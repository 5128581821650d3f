/*
 * A phase hook of the EP data calls, for etp's own benchmark
 * (tools/etp_bench_ep.c): not part of the public API, no stability promise.
 *
 * The exchange inside a data call runs between local kernels that the
 * public API cannot separate (dispatch: pack, exchange, expand; combine:
 * pre-sum, exchange, token-side sum), so a benchmark that wants each
 * phase's time needs to mark the boundaries on the call's stream. When a
 * hook is set, etp_ep_dispatch, etp_ep_combine and etp_ep_dispatch_bwd call
 * it on the host, in the calling thread, right before they enqueue the
 * exchange (ETP__EP_PHASE_EXCHANGE_BEGIN) and right after
 * (ETP__EP_PHASE_EXCHANGE_END), with the call's stream; the hook may
 * record an event on it or synchronize it, nothing else of etp.
 */
#ifndef ETP__EP_HOOK_H
#define ETP__EP_HOOK_H

#include "etp/ep.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { ETP__EP_PHASE_EXCHANGE_BEGIN = 0, ETP__EP_PHASE_EXCHANGE_END = 1 };

typedef void (*etp__ep_phase_fn_t)(void *user, int phase, etp_stream_t *stream);

/* Set (fn != NULL) or clear the hook of every layer of `ep`. */
ETP_API etp_status_t etp__ep_set_phase_hook(etp_ep_group_t *ep, etp__ep_phase_fn_t fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* ETP__EP_HOOK_H */
