# Tests of the shard module (included by tests/CMakeLists.txt).
etp_add_unit_test(test_shard_plan unit/test_shard_plan.c shard)
if(ETP_WITH_MPI)
  etp_add_mpi_test_internal(test_shard mpi/test_shard.c shard 1 2 3 4)
  etp_add_mpi_test_internal(test_shard_memory mpi/test_shard_memory.c shard 2)
  etp_add_mpi_test_internal(test_shard_quant mpi/test_shard_quant.c "shard,quant" 2 3 4)
  etp_add_mpi_test_internal(test_shard_graph mpi/test_shard_graph.c shard 1 2 3)
  # The chains' plain-memory paths (gathers not in place, no windows), which
  # the host backend otherwise never takes: ETP_COPY_ENGINE=0.
  foreach(t test_shard test_shard_quant test_shard_graph)
    add_test(NAME ${t}_plain_np2
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --bind-to none
              --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${t}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${t}_plain_np2 PROPERTIES LABELS "mpi;shard"
      ENVIRONMENT "${ETP_TEST_ENV};ETP_COPY_ENGINE=0" TIMEOUT 600 PROCESSORS 2)
  endforeach()
  # The long variant: 1000 steps.
  add_test(NAME test_shard_memory_soak
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_shard_memory> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_shard_memory_soak PROPERTIES LABELS "mpi;shard;soak"
    ENVIRONMENT "${ETP_TEST_ENV};ETP_TEST_STEPS=1000" TIMEOUT 3600)
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI)
  etp_add_gpu_test(test_gpu_shard gpu/test_gpu_shard.c ON shard 1 2 4 8)
  etp_add_gpu_test(test_gpu_shard_quant gpu/test_gpu_shard_quant.c ON "shard,quant" 1 2 4 8)
  etp_add_gpu_test(test_gpu_shard_graph gpu/test_gpu_shard_graph.c ON shard 1 2 4 8)
  # The same on 2, 4 and 8 GPUs with every chain buffer a copy-engine window
  # (the tests' weights are smaller than the 1 MiB a window needs by default:
  # the test knob window_any_size, tests/common/test_knobs.h).
  if(ETP_GPU_TESTS)
    foreach(t test_gpu_shard test_gpu_shard_quant test_gpu_shard_graph)
      foreach(np 2 4 8)
        add_test(NAME ${t}_ce_np${np}
          COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --bind-to none
                  ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${t}> ${MPIEXEC_POSTFLAGS})
        set_tests_properties(${t}_ce_np${np} PROPERTIES LABELS "gpu;shard"
          ENVIRONMENT "${ETP_TEST_ENV};NCCL_NVLS_ENABLE=0;ETP_TEST_WINDOW_ANY_SIZE=1" TIMEOUT 600)
      endforeach()
    endforeach()
  endif()
endif()
