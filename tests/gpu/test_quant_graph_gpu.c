/* The captured quantize on the CUDA backend (1 and 2 GPUs): the program of
 * tests/mpi/test_quant_graph.c, captured with CUDA graphs, the amax
 * all-reduce over NCCL. */
#define ETP_QUANT_GRAPH_CUDA 1
#include "../mpi/test_quant_graph.c"
