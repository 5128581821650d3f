# The quant module's tests (included by tests/CMakeLists.txt).
etp_add_unit_test(test_quant_formats unit/test_quant_formats.c quant)
target_compile_definitions(test_quant_formats PRIVATE ETP_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data")

if(ETP_WITH_MPI)
  # Like etp_add_mpi_test, but linked to the static archive: the test runs
  # the host reference (quant/formats/quant_ref.h) as its oracle.
  etp_test_target(test_quant mpi/test_quant.c ON)
  foreach(np 1 2 3 4)
    add_test(NAME test_quant_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --bind-to none
              --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_quant> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(test_quant_np${np} PROPERTIES LABELS "mpi;quant"
      ENVIRONMENT "${ETP_TEST_ENV}" TIMEOUT 600 PROCESSORS ${np})
  endforeach()
  # The scale swizzle against the cast and the layout formula (no collective).
  etp_add_mpi_test(test_quant_swizzle mpi/test_quant_swizzle.c quant 1)
  # A captured quantize replayed on new data, under the host backend's
  # capture rules (the GPU test's program), against the host reference
  # (hence the static archive).
  etp_add_mpi_test_internal(test_quant_graph mpi/test_quant_graph.c quant 1 2)

  # CUDA kernels against the host reference, byte for byte (1 GPU; 2 GPUs
  # also all-reduce the amaxes over NCCL), and the scale-swizzle kernel (one
  # GPU: no collective). Without CUDA the programs are built for their host
  # variants alone (they include no CUDA header then).
  if(ETP_WITH_CUDA)
    etp_add_gpu_test(test_quant_gpu gpu/test_quant_gpu.c ON quant 1 2 4 8)
    etp_add_gpu_test(test_quant_swizzle_gpu gpu/test_quant_swizzle_gpu.c ON quant 1 4)
  else()
    etp_test_target(test_quant_gpu gpu/test_quant_gpu.c ON)
    etp_test_target(test_quant_swizzle_gpu gpu/test_quant_swizzle_gpu.c ON)
  endif()
  # The same checks on the host backend (ETP_TEST_QUANT_ON_HOST=1), on every
  # machine, CUDA or not: they prove the tests themselves, their special
  # values included, where no GPU runs them.
  add_test(NAME test_quant_gpu_on_host_np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_quant_gpu> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_quant_gpu_on_host_np2 PROPERTIES LABELS "mpi;quant"
    ENVIRONMENT "${ETP_TEST_ENV};ETP_TEST_QUANT_ON_HOST=1" TIMEOUT 600 PROCESSORS 2)
  add_test(NAME test_quant_swizzle_gpu_on_host
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_quant_swizzle_gpu> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_quant_swizzle_gpu_on_host PROPERTIES LABELS "mpi;quant"
    ENVIRONMENT "${ETP_TEST_ENV};ETP_TEST_QUANT_ON_HOST=1" TIMEOUT 600 PROCESSORS 1)
endif()

if(ETP_WITH_CUDA AND ETP_WITH_MPI)
  # test_quant_gpu on one GPU with the cast's grid sized for 8 multiprocessors
  # (test knobs, tests/common/test_knobs.h): each block walks many tiles, and
  # more of the test's tensors get runs of 1 x 4 tiles (with their scale
  # images), partial runs at their edges included, which a full grid gives
  # only to larger batches. NVFP4 16x16 runs with row-major scales go to
  # thread-block clusters there: _noclu runs the same without them, the
  # path of a device that fits none. Both compact every NVFP4 16x16
  # row-major cast's scales (the expansion kernel; by default only large
  # batches do, which the full-grid test leaves uncompacted). (The general
  # kernel meets whole-tile MXFP8 shapes in every variant: test_quant_gpu
  # gives some of those batches a misaligned buffer or one direction.)
  if(ETP_GPU_TESTS)
    foreach(variant sms8 sms8_noclu)
      set(knobs "ETP_TEST_QUANT_LAUNCH_SMS=8;ETP_TEST_QUANT_COMPACT_ALL=1")
      if(variant STREQUAL "sms8_noclu")
        list(APPEND knobs "ETP_TEST_QUANT_NO_CLUSTERS=1")
      endif()
      add_test(NAME test_quant_gpu_np1_${variant}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe --bind-to none
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_quant_gpu> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(test_quant_gpu_np1_${variant} PROPERTIES LABELS "gpu;quant"
        ENVIRONMENT "${ETP_TEST_ENV};NCCL_NVLS_ENABLE=0;${knobs}" TIMEOUT 600)
    endforeach()
  endif()
  # The captured quantize with CUDA graphs; _compact: every NVFP4 16x16
  # row-major cast compacts its scales, so that the expansion kernel is
  # captured too and skipped with the cast on the noop replay.
  etp_add_gpu_test(test_quant_graph_gpu gpu/test_quant_graph_gpu.c ON quant 1 2 4 8)
  if(ETP_GPU_TESTS)
    add_test(NAME test_quant_graph_gpu_np1_compact
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 --oversubscribe --bind-to none
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_quant_graph_gpu> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(test_quant_graph_gpu_np1_compact PROPERTIES LABELS "gpu;quant"
      ENVIRONMENT "${ETP_TEST_ENV};NCCL_NVLS_ENABLE=0;ETP_TEST_QUANT_COMPACT_ALL=1" TIMEOUT 600)
  endif()
endif()
