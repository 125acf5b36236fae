# CLI cases of `mpt contextparallel` (see cli_case in tests/CMakeLists.txt). Tiny config:
# configs/contextparallel_quick.json: a one-block GPT of width 32, 4 heads, vocabulary 33, 2
# sequences of 16 tokens; the load-balance section on 64 positions, 2 timed steps.
set(CPQ contextparallel --config configs/contextparallel_quick.json)

# c = 2 over loopback: each variant's attention within the derived bound of the exact attention
# (both splits), Ulysses bitwise equal to one process, the GPT's loss within its bound, each
# block's activation bytes on every rank equal to the formula, the pairs the ring ran equal to the
# formula, the balanced split even, the bytes sent equal to the formulas.
cli_case(contextparallel_two_processes 0 "OK: 24 of 24 checks passed" ${CPQ})
# The GPT section on the contiguous split.
cli_case(contextparallel_contiguous 0 "OK: 24 of 24 checks passed" ${CPQ} --set cp.split=contiguous)
# One sequence (B = 1): matmul keeps views of qkv instead of copies of q, k, v (probe: the all-gather's
# activation formula subtracted copies that do not exist there, and its check failed on valid input).
cli_case(contextparallel_one_sequence 0 "OK: 24 of 24 checks passed" ${CPQ} --set data.batch=1)
# One process: every exchange is a copy; the same checks hold.
cli_case(contextparallel_one_process 0 "OK: [0-9]+ of [0-9]+ checks passed" ${CPQ} --nproc 1)
# Four ranks: one head each for Ulysses, 2 positions per chunk of the balanced split.
cli_case(contextparallel_four_processes 0 "OK: 28 of 28 checks passed" ${CPQ} --nproc 4)
# Rank 1 dies (exit 86) or hangs at the load-balance section's step 1, inside the ring's send/recv:
# every rank ends within the timeout, exit 3, rank 1 named, no result file, no process left.
add_test(NAME cli.contextparallel_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> ${CPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.contextparallel_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
add_test(NAME cli.contextparallel_hung_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> ${CPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.contextparallel_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${CPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.contextparallel_hung_rank cli.contextparallel_deterministic PROPERTIES TIMEOUT 120)
# Two ranks started by hand with torchrun's variables: rank 0 alone prints and writes.
add_test(NAME cli.contextparallel_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> contextparallel
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.contextparallel_torchrun_env PROPERTIES TIMEOUT 180)

# Bad inputs: exit 2 naming the key, before any process starts.
cli_case(contextparallel_heads_not_divisible 2
         "/model/heads: expected a multiple of the CP degree c = 3 .*got 4 \\[/nproc = 3 from --nproc 3\\]" ${CPQ}
         --nproc 3 --set data.seq=18 --set model.context=18 --set balance.seq=66)
cli_case(contextparallel_seq_not_divisible 2
         "/data/seq: expected a multiple of 2c = 4 \\(the balanced split cuts the sequence into 2c chunks" ${CPQ}
         --set data.seq=14)
cli_case(contextparallel_balance_seq_not_divisible 2 "/balance/seq: expected a multiple of 2c = 8" ${CPQ} --nproc 4
         --set balance.seq=68)
cli_case(contextparallel_seq_over_context 2 "/data/seq: expected at most /model/context = 16, got 32" ${CPQ}
         --set data.seq=32)
cli_case(contextparallel_bad_split 2 "/cp/split" ${CPQ} --set cp.split=zigzag)
cli_case(contextparallel_bad_degree 2 "/nproc" ${CPQ} --nproc 9)
cli_case(contextparallel_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 2" ${CPQ}
         --set fault.rank=2)
