# Tests of the shard module (included by tests/CMakeLists.txt).
etp_add_unit_test(test_shard_plan unit/test_shard_plan.c shard)
if(ETP_WITH_MPI)
  etp_add_mpi_test_internal(test_shard mpi/test_shard.c shard 2 3 4)
  etp_add_mpi_test_internal(test_shard_memory mpi/test_shard_memory.c shard 2)
  etp_add_mpi_test_internal(test_shard_quant mpi/test_shard_quant.c "shard,quant" 2 3 4)
  etp_add_mpi_test_internal(test_shard_graph mpi/test_shard_graph.c shard 1 2 3)
  # The long variant: 1000 steps.
  add_test(NAME test_shard_memory_soak
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_shard_memory> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_shard_memory_soak PROPERTIES LABELS "mpi;shard;soak"
    ENVIRONMENT "${ETP_TEST_ENV};ETP_TEST_STEPS=1000" TIMEOUT 3600)
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI)
  etp_add_gpu_test(test_gpu_shard gpu/test_gpu_shard.c ON shard 1 2)
  etp_add_gpu_test(test_gpu_shard_quant gpu/test_gpu_shard_quant.c ON "shard,quant" 1 2)
  etp_add_gpu_test(test_gpu_shard_graph gpu/test_gpu_shard_graph.c ON shard 1 2)
endif()
