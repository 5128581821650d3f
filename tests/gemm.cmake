# The gemm module's tests (included by tests/CMakeLists.txt).
if(ETP_WITH_MPI)
  etp_add_mpi_test(test_gemm mpi/test_gemm.c gemm 1 2)
endif()
if(ETP_WITH_CUDA)
  # the CUDA plan's chunk rule, on the host (its header declares the
  # pointer kernel's launch, so it needs the CUDA runtime's header)
  etp_add_unit_test(test_gemm_chunks unit/test_gemm_chunks.c gemm)
  target_include_directories(test_gemm_chunks PRIVATE ${PROJECT_SOURCE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI)
  # the CUDA plans (cuBLASLt) against the same double-precision reference
  etp_add_gpu_test(test_gemm_gpu gpu/test_gemm_gpu.c OFF gemm 1)
  target_include_directories(test_gemm_gpu PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/mpi)
endif()
