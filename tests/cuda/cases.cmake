# CUDA tests (label "cuda"): registered when mpt was built against a CUDA LibTorch. Without a
# GPU each reports SKIPPED (exit 77); scripts/gpu-check.sh runs them with `ctest -L cuda`.
function(cuda_case name)
  add_test(NAME cuda.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cuda/run_cuda.sh ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cuda.${name} PROPERTIES LABELS cuda SKIP_RETURN_CODE 77 TIMEOUT 600)
endfunction()

set(_mpt $<TARGET_FILE:mpt>)
set(_out ${CMAKE_CURRENT_BINARY_DIR}/cuda-out)
file(MAKE_DIRECTORY ${_out})
cuda_case(underflow ${_mpt} underflow --device cuda -q --out ${_out}/underflow.json)
cuda_case(lossscale_native ${_mpt} lossscale --device cuda -q --out ${_out}/lossscale.json
          --set /train/compute=native --set /sweep/compute=native --set /train/steps=100
          --set /train/train_samples=2000 --set /train/test_samples=500)
cuda_case(native_vs_emulated_fp16 ${MPT_REF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/numerics/native_vs_emulated.py
          ${_mpt} fp16 ${_out} cuda)
# One GPU: NCCL with a single rank; two GPUs or more: N = 2 (skipped with fewer GPUs, by name).
cuda_case(dataparallel_1gpu ${_mpt} dataparallel --device cuda -q --out ${_out}/dataparallel_1gpu.json
          --config configs/dataparallel_quick.json --nproc 1 --set "train.nprocs=[1]")
cuda_case(dataparallel ${_mpt} dataparallel --device cuda -q --out ${_out}/dataparallel.json
          --config configs/dataparallel_quick.json)
# Threads: every stage on the one GPU. Processes: one GPU per stage, activations and gradients over NCCL.
cuda_case(pipeline ${_mpt} pipeline --device cuda -q --out ${_out}/pipeline.json)
cuda_case(pipeline_processes_nccl ${_mpt} pipeline --device cuda -q --out ${_out}/pipeline_processes.json
          --set executor=processes --set pipeline.stages=2 --nproc 2 --set cost.forward_us=100
          --set "pipeline.microbatches=[1,2,4,8]")
cuda_case(accumulate ${_mpt} accumulate --device cuda -q --out ${_out}/accumulate.json)
cuda_case(checkpoint ${_mpt} checkpoint --device cuda -q --out ${_out}/checkpoint.json)
