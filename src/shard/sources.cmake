# The shard module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_SOURCES src/shard/param.c src/shard/chain.c src/shard/grad.c src/shard/plan.c
  src/shard/grouped.c src/shard/qgather.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_shard.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_shard.c kernels/shard/shard_kernels.cu)
