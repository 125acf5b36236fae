# CLI cases of `mpt dataparallel` (see cli_case in tests/CMakeLists.txt). Tiny configs:
# configs/dataparallel_quick.json trains 6 steps of a 784-32-10 MLP on 512 samples.
set(DPQ dataparallel --config configs/dataparallel_quick.json)

# One process: the equivalence tables, training with N = 1, no_sync, fp16.
cli_case(dataparallel_one_process 0 "OK: [0-9]+ of [0-9]+ checks passed" ${DPQ} --nproc 1 --set "train.nprocs=[1]")
# Training off: nothing runs across processes, so the default /nproc 4 spawns no idle workers
# (ProcessPlan::one_process_because); the equivalence tables run in this one process.
cli_case(dataparallel_no_training_one_process 0
         "/train/enabled is false, so nothing runs across processes: running in this one process, not spawning the 4 of /nproc"
         dataparallel --set train.enabled=false)
# A real 2-process run over loopback: replicas identical, equal to the single-process run.
cli_case(dataparallel_two_processes 0 "n2 +[0-9]+ +[0-9]+ +6 +0 " ${DPQ})
cli_case(dataparallel_no_overlap_divide_after 0 "OK: [0-9]+ of [0-9]+ checks passed" ${DPQ}
         --set ddp.overlap=false --set ddp.divide=after)
# 127 samples, global batch 64 over 2 ranks: shards of 64 and 63, so rank 0 has 2 local batches
# and rank 1 only 1; both stop after 1 step together and 63 samples are dropped.
cli_case(dataparallel_uneven 0 "n2 +[0-9]+ +[0-9]+ +1 +63 " ${DPQ} --set train.samples=127 --set train.max_steps=0)
# A rank dies at step 1 (exit 86 mid-step): every rank ends within the timeout, exit 3, rank 1 named
# with its exit code, no result file, no process left (hung_rank.sh in its exit mode).
add_test(NAME cli.dataparallel_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> dataparallel --config configs/dataparallel_quick.json --set train.nosync_steps=0
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.dataparallel_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
# Issue 38: rank 3 of 4 killed (SIGKILL) at step 1: every other rank names rank 3 alone (rank 1,
# still working or waiting elsewhere when rank 0's all-reduce failed, was named beside it).
add_test(NAME cli.dataparallel_killed_rank_named
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/killed_rank_named.sh $<TARGET_FILE:mpt> dataparallel
                 --config configs/dataparallel_quick.json --nproc 4 --set "train.nprocs=[4]" --set train.nosync_steps=0
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.dataparallel_killed_rank_named PROPERTIES TIMEOUT 120)
# Bad inputs.
cli_case(dataparallel_nproc_zero 2 "config error: --nproc .0.: /nproc: expected an integer >= 1" dataparallel --nproc 0)
cli_case(dataparallel_bucket_zero 2 "/ddp/bucket_cap_mb: expected a number > 0" dataparallel --set ddp.bucket_cap_mb=0)
cli_case(dataparallel_batch_not_multiple 2 "/train/global_batch: expected a multiple" ${DPQ} --set train.global_batch=63)
cli_case(dataparallel_nproc_elsewhere 2 "nproc" underflow --nproc 2)

add_test(NAME cli.dataparallel_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> dataparallel
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.dataparallel_unreachable_master
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> unreachable
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.dataparallel_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> dataparallel
                 --config configs/dataparallel_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.dataparallel_torchrun_env cli.dataparallel_unreachable_master cli.dataparallel_deterministic
                     PROPERTIES TIMEOUT 120)

# A rank hangs (alive but silent) at step 1: rank 0 times out after 3 s, names rank 1, exits 3;
# the launcher blames rank 1, kills it and exits 3; nothing is left running (expected ~5-8 s).
add_test(NAME cli.dataparallel_hung_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> dataparallel --config configs/dataparallel_quick.json --set train.nosync_steps=0
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.dataparallel_hung_rank PROPERTIES TIMEOUT 120)

# Issue 15 (multi-process faults). Sub-second timeouts: LibTorch's connect timeout has whole
# seconds (0.5 s became 0 s: "timed out after 0s"); mpt waits for the master in milliseconds.
cli_case(dataparallel_subsecond_timeout 0 "n2 +[0-9]+ +[0-9]+ +6 +0 " ${DPQ} --set dist.timeout_s=0.5)
foreach(mode garbage world_cap missing_ranks nproc_conflict)
  add_test(NAME cli.dataparallel_env_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> ${mode}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.dataparallel_env_${mode} PROPERTIES TIMEOUT 120)
endforeach()
# Rank 0 alone (N = 1) for longer than the timeout while rank 1 waits: not a failure; the same
# with rank 0 stopped (SIGSTOP): rank 0 named within about the timeout.
foreach(mode busy busy_stop)
  add_test(NAME cli.dataparallel_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stopped_rank.sh $<TARGET_FILE:mpt> ${mode}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.dataparallel_${mode} PROPERTIES TIMEOUT 120)
endforeach()

# Probe defects. 2: a /fault/step no run reaches (the fault never fired and the run "passed"): exit 2
# naming the last step rank 1 trains. configs/dataparallel_quick.json: N = 2 runs min(6 max_steps,
# 512/2 / (64/2) = 8) = 6 steps, 0 .. 5; and the boundary: step 5 is reached (the rank fails, exit 3).
cli_case(dataparallel_fault_step_beyond 2 "/fault/step: expected a step 0 \\.\\. 5 \\(the last step rank 1 trains.*got 6"
         ${DPQ} --set fault.rank=1 --set fault.step=6)
cli_case(dataparallel_fault_step_last 3 "rank 1 of 2 failed" ${DPQ} --set fault.rank=1 --set fault.step=5
         --set dist.timeout_s=5)
cli_case(dataparallel_fault_without_training 2 "/fault/rank: expected -1 with /train/enabled = false" ${DPQ}
         --set train.enabled=false --set fault.rank=1)
# 4: --print-config refuses it the same way.
cli_case(dataparallel_print_config_fault_step 2 "/fault/step: expected a step 0 \\.\\. 5" ${DPQ}
         --set fault.rank=1 --set fault.step=6 --print-config)
# 3: divergence. At lr 1e20 the loss is nan from step 1: the note names each N's run and the step, and
# the vs 1-proc and replica checks compare nan and fail (exit 1; std::max had kept the finite 0).
diverged_case(dataparallel_diverged 1 "diverged: N=2's loss became nan at step 1" ${DPQ} --set train.lr=1e20
              --set train.nosync_steps=0)
# Multi-node (issue 19): DDP over two "nodes" x 2 ranks (network namespaces, a veth pair, one torchrun
# agent per node) equals a one-node --nproc 4 run bitwise (tests/cli/multinode.sh; 77 where no namespaces).
add_test(NAME cli.dataparallel_two_nodes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/multinode.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON} dataparallel
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.dataparallel_two_nodes PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
