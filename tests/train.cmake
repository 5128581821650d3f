# etp-train, end to end (label train): the model on etp against its
# single-rank reference (--check), over rank counts, splits, quantized
# gathers, captured steps and checkpoints. Host backend.
# The reference itself: its quantize-dequantize against etp's, and its
# training on a tiny model (needs a host context, hence MPI, one rank).
if(ETP_WITH_MPI AND TARGET etp_train_ref)
  etp_add_mpi_test(test_train_reference unit/test_train_reference.c train 1)
  target_link_libraries(test_train_reference PRIVATE etp_train_ref)
endif()

# The small kernels (tools/train/moe_ops.h): host, and CUDA against host.
if(ETP_WITH_MPI AND TARGET etp_train_ops)
  etp_add_mpi_test(test_moe_ops mpi/test_moe_ops.c train 1)
  target_link_libraries(test_moe_ops PRIVATE etp_train_ops)
endif()
if(ETP_WITH_CUDA AND ETP_WITH_MPI AND TARGET etp_train_ops)
  # the CUDA kernels against the host loops (1 GPU)
  etp_add_gpu_test(test_moe_ops_gpu gpu/test_moe_ops_gpu.c OFF train 1)
  target_link_libraries(test_moe_ops_gpu PRIVATE etp_train_ops)
endif()

if(NOT ETP_WITH_MPI OR NOT TARGET etp-train)
  return()
endif()

function(etp_train_test name np)
  add_test(NAME train_${name}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --bind-to none
            --mca mpi_yield_when_idle 1 ${MPIEXEC_PREFLAGS} $<TARGET_FILE:etp-train>
            --backend host --quiet ${ARGN} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(train_${name} PROPERTIES LABELS "mpi;train"
    ENVIRONMENT "${ETP_TEST_ENV}" TIMEOUT 600 PROCESSORS ${np})
endfunction()

# --check: the first step's weight gradients and the first 5 losses against
# the reference at 1e-5, as many slots dropped as the reference drops (none
# but with nvlink and --capacity), the loss falling
etp_train_test(check_np1 1 --check --steps 8)
etp_train_test(check_np2_ep2 2 --check --steps 8 --etp 1 --ep 2 --tokens-step 8)
etp_train_test(check_np2_etp2 2 --check --steps 8 --etp 2 --ep 1 --transport capacity)
etp_train_test(check_np3_dp3 3 --check --steps 8 --etp 1 --ep 1 --dp 3 --experts 5 --tokens-step 5)
etp_train_test(check_np3_ep3 3 --check --steps 8 --etp 1 --ep 3 --experts 6 --tokens-step 7)
etp_train_test(check_np4_grid 4 --check --steps 8 --etp 2 --ep 2 --tokens-step 4)
etp_train_test(check_np4_dp 4 --check --steps 8 --etp 1 --ep 2 --dp 2 --experts 6 --transport capacity)
etp_train_test(check_np4_mxfp8 4 --check --steps 8 --etp 2 --ep 2 --quant mxfp8)
etp_train_test(check_np2_nvfp4 2 --check --steps 8 --etp 2 --ep 1 --quant nvfp4)
etp_train_test(check_np2_graph 2 --check --steps 8 --etp 1 --ep 2 --graph)
etp_train_test(check_np4_graph_etp 4 --check --steps 8 --etp 2 --ep 2 --graph --quant mxfp8)
etp_train_test(check_np4_resident 4 --check --steps 8 --etp 2 --ep 2 --resident)
# every weight kept from forward to backward (keep_bytes), captured
etp_train_test(check_np4_keep_graph 4 --check --steps 8 --etp 2 --ep 2 --keep all --graph)
# the nvlink transport (FIXED_SLOTS, counts on the device, exact's drops):
# splits, a captured step, quantized gathers, combine's BF16 wire; with
# --capacity 0.5 (16 slots an expert, 16 x E/EP token rows a rank) both the
# receive capacity and the slots drop, and the reference drops the same
# slots (each step's count is compared too; the summary must show drops)
etp_train_test(check_np2_nvlink_drops 2 --check --steps 8 --etp 1 --ep 2 --tokens 64
  --tokens-step 8 --transport nvlink --capacity 0.5)
etp_train_test(check_np4_nvlink_dp_drops 4 --check --steps 8 --etp 1 --ep 2 --dp 2 --experts 6
  --tokens 48 --transport nvlink --capacity 0.5)
etp_train_test(check_np4_nvlink_graph 4 --check --steps 8 --etp 2 --ep 2 --tokens-step 4
  --transport nvlink --graph --quant mxfp8)
etp_train_test(check_np2_nvlink_wire 2 --check --steps 8 --etp 1 --ep 2 --tokens 64
  --transport nvlink --capacity 0.5 --graph --quant nvfp4 --wire bf16)
foreach(_t check_np2_nvlink_drops check_np4_nvlink_dp_drops check_np2_nvlink_wire)
  # the exit code is then ignored: "check: ok" stands for it
  set_tests_properties(train_${_t} PROPERTIES
    PASS_REGULAR_EXPRESSION "dropped [1-9][0-9]* slots.*check: ok")
endforeach()
# the same under the host backend's adversarial scheduler with collective
# checking: a missing stream-ordering edge in the loop (a grad-ready sum, the
# optimizer's read of main_grad, a captured step) becomes a wrong number
etp_train_test(check_np4_shuffle 4 --check --steps 6 --etp 2 --ep 2 --tokens-step 4)
etp_train_test(check_np4_shuffle_graph 4 --check --steps 6 --etp 1 --ep 2 --dp 2 --graph
  --quant mxfp8)
foreach(_t check_np4_shuffle check_np4_shuffle_graph)
  set_tests_properties(train_${_t} PROPERTIES ENVIRONMENT
    "${ETP_TEST_ENV};ETP_HOST_STREAMS=shuffle;ETP_HOST_SHUFFLE_SEED=7;ETP_CHECK_COLLECTIVES=1")
endforeach()
# the default run: the loss falls 10x over 200 steps; quantized, 5x
etp_train_test(fall_np4 4 --min-fall 10 --csv ${CMAKE_CURRENT_BINARY_DIR}/train_fall.csv
  --svg ${CMAKE_CURRENT_BINARY_DIR}/train_fall.svg)
etp_train_test(fall_np4_mxfp8 4 --min-fall 5 --quant mxfp8)
etp_train_test(fall_np4_nvfp4 4 --min-fall 5 --quant nvfp4)

# refused with exit 2 and a message: a grid that is not the ranks, a capture
# with the exact transport, experts that do not split over EP
function(etp_train_refused name np pattern)
  add_test(NAME train_${name}
    COMMAND sh -c "out=$(\"$0\" \"$@\" 2>&1); rc=$?; case \"$out\" in *'${pattern}'*) [ $rc -eq 2 ] && exit 0 ;; esac; echo \"rc $rc: $out\"; exit 1"
            ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --bind-to none
            ${MPIEXEC_PREFLAGS} $<TARGET_FILE:etp-train> --backend host --quiet ${ARGN}
            ${MPIEXEC_POSTFLAGS})
  set_tests_properties(train_${name} PROPERTIES LABELS "mpi;train"
    ENVIRONMENT "${ETP_TEST_ENV}" TIMEOUT 120 PROCESSORS ${np})
endfunction()
etp_train_refused(bad_grid 4 "must be the 4 ranks" --etp 3)
etp_train_refused(bad_graph_exact 2 "--graph needs the capacity or nvlink transport" --graph
  --transport exact)
etp_train_refused(bad_experts 3 "is not a multiple of the EP size 3" --ep 3 --etp 1 --experts 8)
etp_train_refused(bad_tokens 3 "rank 2 would have -8 tokens" --ep 1 --etp 1 --dp 3 --tokens 32 --tokens-step 20)
etp_train_refused(bad_topk 1 "--topk 9 is more than --experts 8" --topk 9)
etp_train_refused(bad_keep_resident 1 "--resident gathers none" --keep all --resident)
etp_train_refused(bad_keep_quant 1 "with --quant every gather quantizes again" --keep 1 --quant mxfp8)

# a checkpoint saved at one split loads at another: the next 5 losses equal
# an uninterrupted run's (ETP and DP change; then ETP and EP change)
foreach(_case "etp;--etp 2 --ep 2;--etp 1 --ep 2 --dp 2" "ep;--etp 4 --ep 1;--etp 1 --ep 4")
  list(GET _case 0 _name)
  list(GET _case 1 _a)
  list(GET _case 2 _b)
  add_test(NAME train_resume_${_name}_np4
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/train/resume.sh ${MPIEXEC_EXECUTABLE}
            $<TARGET_FILE:etp-train> ${CMAKE_CURRENT_BINARY_DIR}/train_resume_${_name} "${_a}" "${_b}")
  set_tests_properties(train_resume_${_name}_np4 PROPERTIES LABELS "mpi;train"
    ENVIRONMENT "${ETP_TEST_ENV}" TIMEOUT 600 PROCESSORS 4)
endforeach()

# On GPUs (registered with the GPU tests, label gpu): --check against the
# reference at its BF16 tolerance, and the captured step's losses equal to
# the eager step's bit for bit. Each GPU test needs one GPU a rank.
if(ETP_GPU_TESTS)
  set(_small --hidden 128 --ffn 256 --experts 16 --topk 4 --tokens 64)
  function(etp_train_gpu_test name np)
    add_test(NAME train_gpu_${name}_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe --bind-to none
              ${MPIEXEC_PREFLAGS} $<TARGET_FILE:etp-train> --backend cuda --quiet ${ARGN}
              ${MPIEXEC_POSTFLAGS})
    set_tests_properties(train_gpu_${name}_np${np} PROPERTIES LABELS "gpu;train"
      ENVIRONMENT "${ETP_TEST_ENV};NCCL_NVLS_ENABLE=0" TIMEOUT 600)
  endfunction()
  etp_train_gpu_test(check 1 --check --steps 6 ${_small})
  etp_train_gpu_test(check 2 --check --steps 6 --etp 1 --ep 2 --tokens-step 8 --quant nvfp4 ${_small})
  etp_train_gpu_test(check 4 --check --steps 6 --etp 2 --ep 2 ${_small})
  etp_train_gpu_test(check_graph 4 --check --steps 6 --etp 2 --ep 2 --quant mxfp8 --graph ${_small})
  etp_train_gpu_test(check_keep 4 --check --steps 6 --etp 2 --ep 2 --keep all --graph ${_small})
  # the NVLink transport's kernels in the loop, captured
  etp_train_gpu_test(check_nvlink 2 --check --steps 6 --etp 1 --ep 2 --transport nvlink --graph ${_small})
  etp_train_gpu_test(check_nvlink 4 --check --steps 6 --etp 2 --ep 2 --transport nvlink --wire bf16 ${_small})
  foreach(np 1 4)
    add_test(NAME train_gpu_graph_same_np${np}
      COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/train/graph_same.sh ${MPIEXEC_EXECUTABLE} ${np}
              $<TARGET_FILE:etp-train> ${CMAKE_CURRENT_BINARY_DIR}/train_graph_same_np${np}
              --backend cuda --etp 1 --ep ${np} --steps 8 --pool 2 --hidden 1024 --ffn 1024
              --experts 16 --topk 4 --tokens 1024)
    set_tests_properties(train_gpu_graph_same_np${np} PROPERTIES LABELS "gpu;train"
      ENVIRONMENT "${ETP_TEST_ENV};NCCL_NVLS_ENABLE=0" TIMEOUT 600)
  endforeach()
endif()
