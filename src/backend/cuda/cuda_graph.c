/* The CUDA backend's graph capture: CUDA stream capture and graphs. */
#include <stdlib.h>

#include "cuda_internal.h"

/* ---- ops: graph capture ------------------------------------------------- */

typedef struct {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} cuda_graph_t;

etp_status_t etp__cuda_capture_begin(etp__be_t *be, etp__bstream_t *s)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    /* Thread-local: this thread's unsafe calls (an allocation, a host wait)
     * fail during the capture instead of silently breaking it. */
    cudaError_t e = cudaStreamBeginCapture(s->s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return etp__cuda_error("cudaStreamBeginCapture", e);
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_capture_end(etp__be_t *be, etp__bstream_t *s, void **graph)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cuda_graph_t *g = calloc(1, sizeof *g);
    if (!g) return etp__err(ETP_ERR_OUT_OF_MEMORY, "end capture: out of host memory");
    cudaError_t e = cudaStreamEndCapture(s->s, &g->graph);
    /* Each kernel node keeps the priority of the stream it was captured
     * on (the chains' gathers and reductions run at high priority, so their
     * kernels get SMs ahead of the caller's GEMM blocks, as when eager);
     * without the flag a replay runs every node at the launch stream's. */
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&g->exec, g->graph, cudaGraphInstantiateFlagUseNodePriority);
    if (e != cudaSuccess) {
        if (g->graph) cudaGraphDestroy(g->graph);
        free(g);
        return etp__cuda_error("ending the capture (cudaStreamEndCapture / cudaGraphInstantiate)",
                               e);
    }
    *graph = g;
    return ETP_SUCCESS;
}

etp_status_t etp__cuda_graph_launch(etp__be_t *be, void *graph, etp__bstream_t *s)
{
    ETP__TRY(etp__cuda_set_device(etp__cuda_of(be)));
    cudaError_t e = cudaGraphLaunch(((cuda_graph_t *)graph)->exec, s->s);
    if (e != cudaSuccess) return etp__cuda_error("cudaGraphLaunch", e);
    return ETP_SUCCESS;
}

void etp__cuda_graph_destroy(etp__be_t *be, void *graph)
{
    cuda_graph_t *g = graph;
    if (!g) return;
    (void)cudaSetDevice(etp__cuda_of(be)->device);
    cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free(g);
}
