# Parity of `mpt fp8` with a PyTorch-Python twin that quantizes with torch.float8_e4m3fn / float8_e5m2
# (tests/parity/fp8_ref.py, fp8_common.py): every step's loss, the test loss and accuracy of fp32, bf16
# and the tensorwise recipe equal bit for bit. Skipped (77) where the reference torch has no float8 dtypes (1.13).
function(fp8_parity_case name ref)
  add_test(NAME parity.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/parity/fp8_parity.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON} ${ref} ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(parity.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()
set(FP8_PARITY fp8 --set "recipes=[\"fp32\",\"bf16\",\"tensorwise\"]" --set train.steps=30 --set data.train_samples=1024
               --set data.test_samples=500 --set "model.hidden=[128,128]" --set ledger.step=5 --set outlier.enabled=false
               --set accumulator.k=256)
fp8_parity_case(fp8_tensorwise_hybrid_all fp8_ref.py ${FP8_PARITY} --set model.fp8_layers=all)
fp8_parity_case(fp8_tensorwise_e4m3_inner fp8_ref.py ${FP8_PARITY} --set format=e4m3 --seed 3)
# Section 3 (the tiny GPT, tests/parity/fp8_gpt_ref.py): every step's loss, the train, validation
# and last losses of fp32, bf16 and tensorwise equal bit for bit; the MLP sections run at their
# smallest beside it (their twin is fp8_ref.py).
set(FP8_GPT_PARITY fp8 --set "recipes=[\"fp32\",\"bf16\",\"tensorwise\"]" --set train.steps=2 --set data.train_samples=256
                   --set data.test_samples=100 --set "model.hidden=[32]" --set model.fp8_layers=all --set ledger.step=0 --set outlier.enabled=false
                   --set accumulator.k=256 --set gpt.enabled=true --set gpt.model.layers=2 --set gpt.model.width=32
                   --set gpt.model.heads=2 --set gpt.model.context=16 --set gpt.batch=4 --set gpt.steps=10
                   --set gpt.ledger_step=2 --set gpt.mean_of_last=4 --set gpt.eval_batches=2)
fp8_parity_case(fp8_gpt_hybrid fp8_gpt_ref.py ${FP8_GPT_PARITY})
fp8_parity_case(fp8_gpt_e4m3_seed3 fp8_gpt_ref.py ${FP8_GPT_PARITY} --set format=e4m3 --seed 3 --set gpt.model.layers=1)
