# Timelines: `--trace FILE` (docs/timelines.md; tests/cli/trace_cases.py says what each case checks).
foreach(case pipeline_threads pipeline_processes pipeline_workers dataparallel single mesh unwritable atomic plot
        over_store_limit contextparallel expertparallel)
  add_test(NAME cli.trace_${case}
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/trace_cases.py $<TARGET_FILE:mpt> ${case}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.trace_${case} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
# --trace naming the result file (directly, through ../, or through a symbolic link): exit 2 before the run,
# nothing written (the trace would replace the result)
cli_case(trace_same_as_out 2 "--trace r.json: expected a file other than the result file \\(--out r.json\\)" underflow
         --out r.json --trace r.json)
cli_case(trace_same_as_out_dotdot 2 "expected a file other than the result file" underflow --out sub/../r.json --trace r.json)
# An interrupted run (SIGINT, SIGTERM) removes the --out / --trace folders it created (tests/cli/interrupted.py).
add_test(NAME cli.interrupted_run_folders COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/interrupted.py $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.interrupted_run_folders PROPERTIES TIMEOUT 300)
# Interrupted while writing (SIGTERM while a FIFO --trace blocks the write, the result staged): no
# temporary file or folder left, in one process and under --nproc (the launcher passes the signal on).
add_test(NAME cli.interrupted_while_writing
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/interrupted.py $<TARGET_FILE:mpt> writing
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.interrupted_while_writing PROPERTIES TIMEOUT 300)
