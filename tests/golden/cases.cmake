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
# Each golden check runs under the kernels of other CPUs, simulated on this one: oneDNN capped to
# AVX2 and to AVX512_CORE (ONEDNN_MAX_CPU_ISA; DNNL_MAX_CPU_ISA for the oneDNN 2.x of LibTorch
# 1.13; a cap above the CPU changes nothing), ATen's vectorised kernels at their DEFAULT (no
# AVX) level (ATEN_CPU_CAPABILITY: other reduction orders, as another CPU's vector width
# gives), and 2 intra-op threads. All must hold within tests/golden/tolerances/.
set(_golden_variants
  "golden|1|"
  "golden_t2|2|"
  "golden_isa_avx2|1|ONEDNN_MAX_CPU_ISA=AVX2,DNNL_MAX_CPU_ISA=AVX2"
  "golden_isa_avx512|1|ONEDNN_MAX_CPU_ISA=AVX512_CORE,DNNL_MAX_CPU_ISA=AVX512_CORE"
  "golden_aten_default|1|ATEN_CPU_CAPABILITY=default")
foreach(c ${MPT_GOLDEN_CONFIGS})
  get_filename_component(n ${c} NAME)
  string(REPLACE ".config.json" "" n ${n})
  foreach(v ${_golden_variants})
    string(REPLACE "|" ";" v "${v}")  # name|threads|VAR=VALUE,VAR=VALUE
    list(GET v 0 prefix)
    list(GET v 1 threads)
    list(GET v 2 envs)
    add_test(NAME ${prefix}.${n}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_golden.sh $<TARGET_FILE:mpt> ${_golden_dir}/${n}.json
                     ${threads}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${prefix}.${n} PROPERTIES SKIP_RETURN_CODE 77)
    if(envs)
      string(REPLACE "," ";" envs "${envs}")
      set_tests_properties(${prefix}.${n} PROPERTIES ENVIRONMENT "${envs}")
    endif()
  endforeach()
endforeach()
# The lossscale golden run with core/rounding_simd's loops forced to the baseline (MPT_SIMD): the
# same golden file as the vector levels the CPU picks by default, since every level rounds alike.
if(EXISTS ${_golden_dir}/lossscale.json)
  add_test(NAME golden_simd_baseline.lossscale
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_golden.sh $<TARGET_FILE:mpt> ${_golden_dir}/lossscale.json 1
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(golden_simd_baseline.lossscale PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT "MPT_SIMD=baseline")
endif()
