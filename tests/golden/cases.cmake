# Golden results: every experiment on a small fixed config, compared with `mpt compare`.
# The configs (golden/<exp>.config.json) are shared; the expected results are per LibTorch
# line, because kernels differ in the last bits between releases: golden/<exp>.json for
# Debian's LibTorch 1.13, golden/torch2/<exp>.json for LibTorch 2.x (scripts/update-golden.sh
# [--torch pip] regenerates them on purpose). A build whose line has no golden files skips them
# visibly.
if(Torch_VERSION VERSION_GREATER_EQUAL 2)
  set(_golden_dir ${CMAKE_CURRENT_SOURCE_DIR}/golden/torch2)
else()
  set(_golden_dir ${CMAKE_CURRENT_SOURCE_DIR}/golden)
endif()
file(GLOB MPT_GOLDEN_CONFIGS ${CMAKE_CURRENT_SOURCE_DIR}/golden/*.config.json)
foreach(c ${MPT_GOLDEN_CONFIGS})
  get_filename_component(n ${c} NAME)
  string(REPLACE ".config.json" "" n ${n})
  add_test(NAME golden.${n}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_golden.sh $<TARGET_FILE:mpt> ${_golden_dir}/${n}.json
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(golden.${n} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()
