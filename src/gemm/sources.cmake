# The gemm module's files (included by the top-level CMakeLists.txt). The
# CUDA side is cuBLASLt (CUDA::cublasLt in ETP_CUDA_LIBS); its one kernel
# writes the pointer arrays of PACKED's chunked matmuls.
list(APPEND ETP_SOURCES src/gemm/gemm.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_gemm.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_gemm.c kernels/gemm/gemm_chunks.cu)
