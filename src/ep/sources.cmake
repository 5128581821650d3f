# The ep module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_SOURCES src/ep/ep.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_ep.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_ep.c kernels/ep/ep.cu)
# MXFP8 dispatch quantizes with quant/formats/qf_codec.h, shared with the
# host reference: like kernels/quant, no contraction of a multiply and an add
# into an FMA the host does not make (the other EP kernels use explicit fmaf
# and __fadd_rn, unaffected).
set_source_files_properties(kernels/ep/ep.cu PROPERTIES COMPILE_OPTIONS "--fmad=false")
