# Parity with PyTorch-Python of the same LibTorch (MPT_REF_PYTHON: the wheel's Python on the default
# route, Debian's python3-torch 1.13.1 with --torch debian).
function(parity_case name ref)
  add_test(NAME parity.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/parity/run_parity.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON}
                   ${CMAKE_CURRENT_SOURCE_DIR}/parity/${ref} ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(parity.${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()

parity_case(underflow_default underflow_ref.py underflow)
parity_case(underflow_depth_sweep underflow_ref.py underflow --config configs/underflow_depth_sweep.json)
parity_case(underflow_cast_non_finite underflow_ref.py underflow --set "cast.values=[\"nan\",\"inf\",\"-inf\",1e-3,70000]")
parity_case(underflow_update_rounds_to_zero underflow_ref.py underflow --set updates.count=5 --set updates.step=1e-30)
parity_case(underflow_seed7_wide underflow_ref.py underflow --seed 7 --set model.width=64 --set data.batch=128)
