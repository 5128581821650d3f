# etp-train's tests (included by tests/CMakeLists.txt): its small kernels
# (tools/train/moe_ops.h) on the host backend, one rank.
if(ETP_WITH_MPI AND TARGET etp_train_ops)
  etp_add_mpi_test(test_moe_ops mpi/test_moe_ops.c train 1)
  target_link_libraries(test_moe_ops PRIVATE etp_train_ops)
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI AND TARGET etp_train_ops)
  # the CUDA kernels against the host loops (1 GPU)
  etp_add_gpu_test(test_moe_ops_gpu gpu/test_moe_ops_gpu.c OFF train 1)
  target_link_libraries(test_moe_ops_gpu PRIVATE etp_train_ops)
endif()
