# The ep module's tests (included by tests/CMakeLists.txt).
# The rules only the CUDA kernels use, against EXACT's clip
etp_add_unit_test(test_ep_rules unit/test_ep_rules.c ep)
if(ETP_WITH_MPI)
  etp_add_mpi_test(test_ep mpi/test_ep.c ep 2 3 4 8)
  # Low-latency layers against the reference and EXACT (and captured)
  etp_add_mpi_test(test_ep_ll mpi/test_ep_ll.c ep 1 2 3 4)
  # MXFP8 dispatch against the quant module's host reference (quant_ref.h):
  # linked to the static archive.
  etp_add_mpi_test_internal(test_ep_mxfp8 mpi/test_ep_mxfp8.c "ep,quant" 2 3 4)
  # The GPU test's captured step, under the host backend's capture rules.
  etp_add_mpi_test_internal(test_ep_graph mpi/test_ep_graph.c "ep,quant" 2 3)
  # The long memory run: 10,000 steps of random routing (label soak).
  add_test(NAME test_ep_soak_np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_ep> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_ep_soak_np2 PROPERTIES LABELS "mpi;ep;soak"
    ENVIRONMENT "${ETP_TEST_ENV};ETP_EP_STEPS=10000" TIMEOUT 7200 PROCESSORS 2)
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI)
  # internal: the MXFP8 steps use the quant module's host reference
  etp_add_gpu_test(test_ep_gpu gpu/test_ep_gpu.c ON "ep,quant" 1 2 4 8)
  # MXFP8 dispatch's steps apart from the rest
  etp_gpu_test_part(test_ep_gpu mx "test_mx_*" 1 2 4 8)
  target_include_directories(test_ep_gpu PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/mpi)
  # The NVLink transport's bounded waits: a peer that never comes
  etp_add_gpu_test(test_ep_nvl_timeout gpu/test_ep_nvl_timeout.c OFF "ep" 2)
endif()
