# Finds NCCL and defines the imported target etp::nccl (nccl.h and libnccl).
# etp's own build includes this file, and so does the installed
# etpConfig.cmake (it is installed beside it): a project that uses etp looks
# NCCL up on its own machine instead of reusing the path etp was built with.
#
# Where to look, besides the CUDA toolkit (CUDAToolkit_* set by
# find_package(CUDAToolkit) first) and the system's directories: the CMake
# variable NCCL_ROOT, or the environment variables NCCL_ROOT or NCCL_HOME.
# ETP_NCCL_INCLUDE_DIR and ETP_NCCL_LIBRARY are cache entries: set them to
# choose one NCCL.
if(NOT TARGET etp::nccl)
  find_path(ETP_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  find_library(ETP_NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_DIR}
          ${CUDAToolkit_LIBRARY_ROOT}
    PATH_SUFFIXES lib lib64)
  if(ETP_NCCL_INCLUDE_DIR AND ETP_NCCL_LIBRARY)
    add_library(etp::nccl UNKNOWN IMPORTED)
    set_target_properties(etp::nccl PROPERTIES
      IMPORTED_LOCATION "${ETP_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ETP_NCCL_INCLUDE_DIR}")
  endif()
endif()
