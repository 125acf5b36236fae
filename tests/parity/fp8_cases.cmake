# Parity of `mpt fp8` with a PyTorch-Python twin that quantizes with torch.float8_e4m3fn / float8_e5m2
# (tests/parity/fp8_ref.py): every step's loss, the test loss and accuracy of fp32, bf16 and the
# tensorwise recipe equal bit for bit. Skipped (77) where the reference torch has no float8 dtypes (1.13).
function(fp8_parity_case name)
  add_test(NAME parity.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/parity/fp8_parity.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON} ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(parity.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()
set(FP8_PARITY fp8 --set "recipes=[\"fp32\",\"bf16\",\"tensorwise\"]" --set train.steps=30 --set data.train_samples=1024
               --set data.test_samples=500 --set "model.hidden=[128,128]" --set ledger.step=5 --set outlier.enabled=false
               --set accumulator.k=256)
fp8_parity_case(fp8_tensorwise_hybrid_all ${FP8_PARITY} --set model.fp8_layers=all)
fp8_parity_case(fp8_tensorwise_e4m3_inner ${FP8_PARITY} --set format=e4m3 --seed 3)
