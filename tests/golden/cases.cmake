# Golden results: every experiment on a small fixed config, compared with `mpt compare`.
file(GLOB MPT_GOLDEN_FILES ${CMAKE_CURRENT_SOURCE_DIR}/golden/*.json)
foreach(g ${MPT_GOLDEN_FILES})
  get_filename_component(n ${g} NAME_WE)
  if(NOT g MATCHES "\\.config\\.json$")
    add_test(NAME golden.${n}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/golden/check_golden.sh $<TARGET_FILE:mpt> ${g}
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  endif()
endforeach()
