# The ep module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_SOURCES src/ep/ep.c src/ep/ep_ll.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_ep.c)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_ep.c kernels/ep/ep.cu kernels/ep/nvl.cu
     kernels/ep/nvl_window.cu kernels/ep/ll.cu)
# The kernels apply src/ep/ep_rules.h (and quant/formats/qf_codec.h for
# MXFP8 dispatch), which the host backend runs too: like kernels/quant, no
# contraction of a multiply and an add into an FMA the host does not make
# (every FMA of the rules is an explicit fmaf).
set_source_files_properties(kernels/ep/ep.cu kernels/ep/nvl.cu kernels/ep/ll.cu PROPERTIES COMPILE_OPTIONS
                            "--fmad=false")
