# The quant module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_HOST_SOURCES src/backend/host/host_quant.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_quant.c)
