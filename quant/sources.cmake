# The quant module's files (included by the top-level CMakeLists.txt).
list(APPEND ETP_SOURCES quant/quant.c quant/formats/quant_ref.c)
list(APPEND ETP_HOST_SOURCES src/backend/host/host_quant.c)
set(ETP_QUANT_KERNELS kernels/quant/quant_kernels.cu kernels/quant/amax.cu kernels/quant/cast_v3.cu
    kernels/quant/cast_sr.cu kernels/quant/dequant.cu)
list(APPEND ETP_CUDA_SOURCES src/backend/cuda/cuda_quant.c ${ETP_QUANT_KERNELS} kernels/quant/swizzle.cu)
# The kernels share quant/formats/qf_codec.h with the host reference and must
# round exactly as it does: no contraction of a multiply and an add into an
# FMA the host does not make (the host C code is compiled without
# contraction: -std=c11). Divisions and square roots stay IEEE (the default).
set_source_files_properties(${ETP_QUANT_KERNELS} PROPERTIES COMPILE_OPTIONS "--fmad=false")
