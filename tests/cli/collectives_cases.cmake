# CLI cases of `mpt collectives` (see cli_case in tests/CMakeLists.txt). Tiny config:
# configs/collectives_quick.json measures 8 B .. 64 KiB (x4), 2 timed iterations after 1 warm-up.
set(CQ collectives --config configs/collectives_quick.json)

# Result-document cases (tests/cli/collectives.sh): 2 and 3 processes pass with #wrong 0 and
# nccl-tests' size/count/busbw; a corrupted rank fails the check (exit 1); a torchrun-style launch.
# bfloat16 (refused with exit 2 on LibTorch 1.13, whose Gloo has none); scripts/plot.py draws the busbw and time plots (skipped without matplotlib).
foreach(mode pass three corrupt torchrun bfloat16 plot)
  add_test(NAME cli.collectives_${mode}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/collectives.sh $<TARGET_FILE:mpt> ${mode}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.collectives_${mode} PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
endforeach()
# One process: every operation but sendrecv (which needs a peer) runs; all_reduce's busbw factor is 0.
cli_case(collectives_one_process 0 "all_reduce: 1 ranks, gloo, .*busbw = algbw x 0" ${CQ} --nproc 1
         --set "ops=[\"all_reduce\",\"all_gather\",\"reduce_scatter\",\"broadcast\",\"alltoall\"]")
cli_case(collectives_float16_min 0 "OK: 6 of 6 checks passed" ${CQ} --set dtype=float16 --set redop=min)
cli_case(collectives_row_format 0 " 32768 +8192 +float32 +sum +-1 +in +[0-9.]+ " ${CQ} --set "ops=[\"all_reduce\"]")
add_test(NAME cli.collectives_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${CQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.collectives_deterministic PROPERTIES TIMEOUT 180)

# A rank dies at the 4th measurement: every rank ends within the timeout, naming rank 1 (exit 3).
cli_case(collectives_killed_rank 3 "rank 1 of 2 failed" ${CQ} --set fault.rank=1 --set fault.step=3
         --set dist.timeout_s=5)
# A rank hangs (alive, silent): rank 0's collective times out after 3 s naming rank 1 (exit 3).
cli_case(collectives_hung_rank 3 "rank 1 of 2 failed \\(did not answer" ${CQ} --set fault.rank=1 --set fault.step=3 --set fault.mode=hang
         --set dist.timeout_s=3)

# Bad input: exit 2 naming the key, before any worker is spawned, nothing written.
cli_case(collectives_min_above_max 2 "/min_bytes: expected at most /max_bytes \\(512\\), got 1024" ${CQ}
         --set min_bytes=1024 --set max_bytes=512)
cli_case(collectives_unknown_op 2 "/ops/1: .*did you mean \"all_gather\"" ${CQ} --set "ops=[\"all_reduce\",\"allgather\"]")
cli_case(collectives_step_factor_one 2 "/step_factor: expected an integer >= 2" ${CQ} --set step_factor=1)
cli_case(collectives_sendrecv_one_process 2 "/ops/5: \"sendrecv\" needs at least 2 processes.*got 1" ${CQ} --nproc 1)
cli_case(collectives_root_missing 2 "/root: expected a rank 0 .. 1, got 2" ${CQ} --set root=2)
cli_case(collectives_corrupt_rank_missing 2 "/check/corrupt_rank: expected -1 or a rank 0 .. 1, got 3" ${CQ}
         --set check.corrupt_rank=3)
cli_case(collectives_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 2" ${CQ} --set fault.rank=2)
# A fault step beyond the measurements that run would never fail: refused, naming the count.
cli_case(collectives_fault_step_beyond 2 "/fault/step: expected a measurement 0 \\.\\. [0-9]+ .*got 1000" ${CQ}
         --set fault.rank=1 --set fault.step=1000)
cli_case(collectives_op_twice 2 "/ops/1: expected each value once, got \"broadcast\" again" ${CQ}
         --set "ops=[\"broadcast\",\"broadcast\"]")
cli_case(collectives_no_ops 2 "/ops: expected a list of strings \\(non-empty\\), got \\[\\]" ${CQ} --set "ops=[]")
cli_case(collectives_max_below_one_element 2 "/max_bytes: expected at least 8 bytes for \"all_gather\" on 2 ranks" ${CQ}
         --set min_bytes=4 --set max_bytes=4)
cli_case(collectives_bad_dtype 2 "/dtype: .*did you mean \"float64\"" ${CQ} --set dtype=float61)
# The thread policy a 2-process run records (issue 16, item 3): max(1, cores / 2) intra-op threads
# per rank, libgomp's waiters PASSIVE by mpt's default — and a user's OMP_WAIT_POLICY kept.
result_case(threads_policy_two_ranks threads_policy_two_ranks ${CQ} --nproc 2 --set "ops=[\"all_reduce\"]")
result_case(threads_policy_user_wait_policy threads_policy_two_ranks ${CQ} --nproc 2 --set "ops=[\"all_reduce\"]")
set_tests_properties(cli.threads_policy_user_wait_policy PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=ACTIVE")
# ... and the binding of each rank to its own cores switched off (env.threads_policy.cpu_bind).
result_case(threads_policy_no_binding threads_policy_two_ranks ${CQ} --nproc 2 --set "ops=[\"all_reduce\"]")
set_tests_properties(cli.threads_policy_no_binding PROPERTIES ENVIRONMENT "MPT_CPU_BIND=none")

# Gloo's reduce-scatter and all-gather beside mpt's send/recv ring (columns "ring time",
# "native/ring"; verified alike), and the ring as the measured default (dist.gloo_algorithm).
cli_case(collectives_ring_beside_native 0 "all_gather: 2 ranks, gloo, .*beside it mpt's send/recv ring" ${CQ}
         --set "ops=[\"all_gather\",\"reduce_scatter\"]")
cli_case(collectives_ring 0 "OK: 6 of 6 checks passed" ${CQ} --set dist.gloo_algorithm=ring)
cli_case(collectives_bad_gloo_algorithm 2 "/dist/gloo_algorithm: expected one of .*got \"tree\"" ${CQ}
         --set dist.gloo_algorithm=tree)
# A rank dies or hangs inside the ring's measurements: every rank ends within the timeout, naming rank 1.
cli_case(collectives_ring_killed_rank 3 "rank 1 of 2 failed" ${CQ} --set "ops=[\"reduce_scatter\"]"
         --set dist.gloo_algorithm=ring --set fault.rank=1 --set fault.step=2 --set dist.timeout_s=5)
cli_case(collectives_ring_hung_rank 3 "rank 1 of 2 failed \\(did not answer" ${CQ} --set "ops=[\"reduce_scatter\"]"
         --set dist.gloo_algorithm=ring --set fault.rank=1 --set fault.step=2 --set fault.mode=hang
         --set dist.timeout_s=3)
