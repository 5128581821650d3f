# The ep module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_SOURCES src/ep/ep.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_ep.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_ep.c kernels/ep/ep.cu)
