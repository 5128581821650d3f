# The shard module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_HOST_SOURCES src/backend/host/host_shard.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_shard.c)
