/* Host kernels of the quant module: the reference quantizer, enqueued on a
 * host stream like any other operation (so shuffle mode orders it only by
 * stream order and declared event waits). */
#include "../kernels_quant.h"
#include "host_internal.h"
#include "quant/formats/quant_ref.h"

static void quant_run(void *args)
{
    etp__qref_run_batch(args);
}

static etp_status_t host_quant_run(etp__be_t *be, etp__bstream_t *s, const etp__qbatch_t *b)
{
    /* only the tensors in use are copied */
    return etp__host_launch(be, s, quant_run, b, etp__qbatch_bytes(b->n));
}

static void swizzle_run(void *args)
{
    etp__qref_run_swizzle(args);
}

static etp_status_t host_quant_swizzle(etp__be_t *be, etp__bstream_t *s, const etp__qswz_batch_t *b)
{
    return etp__host_launch(be, s, swizzle_run, b, etp__qswz_batch_bytes(b->n));
}

const etp__quant_kernels_t etp__host_quant_kernels = {
    .workspace_bytes = 0, /* the reference needs no scratch */
    .workspace_init = NULL,
    .launch_width = NULL, /* the reference runs on one thread */
    .run = host_quant_run,
    .swizzle = host_quant_swizzle,
};
