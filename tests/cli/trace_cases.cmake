# Timelines: `--trace FILE` (docs/timelines.md; tests/cli/trace_cases.py says what each case checks).
foreach(case pipeline_threads pipeline_processes dataparallel single unwritable atomic plot)
  add_test(NAME cli.trace_${case}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/trace_cases.py $<TARGET_FILE:mpt> ${case}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.trace_${case} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
