# etp-train's tests (included by tests/CMakeLists.txt). The reference is
# built with the tools (tools/CMakeLists.txt); its test needs a host
# context, hence MPI (one rank).
if(ETP_WITH_MPI AND TARGET etp_train_ref)
  etp_add_mpi_test(test_train_reference unit/test_train_reference.c train 1)
  target_link_libraries(test_train_reference PRIVATE etp_train_ref)
endif()
