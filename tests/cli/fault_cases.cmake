# Hostile input and faults (issue 15): memory refusals, cross-key limits, output that goes
# astray. cli_case as in cases.cmake; cli_case_env runs it with environment variables set.

# Defect 7: a config too large for the machine is refused before allocating (exit 2, keys named),
# not OOM-killed. The probe's case needs ~320 GiB; the cap makes the test independent of the host
# (without it the limit is MemAvailable of /proc/meminfo).
cli_case_env(memory_checkpoint_too_big MPT_MEMORY_LIMIT_BYTES=8589934592 2
             "/model/width, /model/depth: this config needs about [0-9.]+ GiB .*more than the 8.00 GiB available \\(MPT_MEMORY_LIMIT_BYTES\\)"
             checkpoint --set model.width=65536 --set model.depth=4 --set "checkpoint.segments=[\"1\",\"2\"]" --set data.batch=8)
cli_case_env(memory_underflow_batch MPT_MEMORY_LIMIT_BYTES=1000000000 2 "/data/batch, /model/width.*needs about"
             underflow --set data.batch=1000000 --set model.width=4096 --set model.depth=2)
cli_case_env(memory_dataparallel_per_process MPT_MEMORY_LIMIT_BYTES=100000000 2 "x4 processes \\(/nproc\\)"
             dataparallel --nproc 4 --set equivalence.batch=1000000 --set equivalence.in_dim=16)
# --print-config makes the memory check a run makes (cheap, no side effects): the same refusal.
cli_case_env(print_config_memory MPT_MEMORY_LIMIT_BYTES=1000000000 2 "/data/batch, /model/width.*needs about"
             underflow --print-config --set data.batch=1000000 --set model.width=4096 --set model.depth=2)
cli_case_env(memory_limit_off MPT_MEMORY_LIMIT_BYTES=0 0 ANY underflow --set model.depth=2)
cli_case_env(memory_limit_malformed MPT_MEMORY_LIMIT_BYTES=4GB 2 "MPT_MEMORY_LIMIT_BYTES: expected an integer >= 0"
             underflow --set model.depth=2)
# Defect 11: BatchNorm1d needs two samples per micro-batch; a config error naming both keys,
# not LibTorch's "Expected more than 1 value per channel when training" with exit 3.
cli_case(accumulate_bad_batchnorm_micro_batches 2
         "/batchnorm/micro_batches: expected at most /batch / 2 = 32 .*got 64"
         accumulate --set batchnorm.micro_batches=64)
# Defects 2, 8, 11: stdout full/closed/gone, --out through links and /dev/stdout, folders removed.
add_test(NAME cli.stdout_and_out_faults
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stdout_and_out_faults.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.stdout_and_out_faults PROPERTIES TIMEOUT 300)
# A fault with one process: no peer can find it (it exited 86 or hung forever): refused before the run.
cli_case(fault_rank_one_process 2 "/fault/rank: expected -1 with one process .*got 0"
         dataparallel --nproc 1 --set fault.rank=0 --set fault.mode=hang)
