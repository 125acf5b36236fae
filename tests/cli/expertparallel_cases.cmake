# CLI cases of `mpt expertparallel` (see cli_case in tests/CMakeLists.txt). Tiny config:
# configs/expertparallel_quick.json: a one-block MoE GPT of width 32, 4 heads, 4 experts (top-2,
# expert hidden 64), 2 sequences of 16 tokens per rank, 6 training steps per balancing method.
set(EPQ expertparallel --config configs/expertparallel_quick.json)

# e = 2 over loopback: for each balancing method, at the initial and the trained weights, logits
# and expert gradients bitwise equal to one process, routing and drops equal, dense gradients and
# the loss within the bound of a reordered sum; all-to-all bytes and payload equal to the formulas.
cli_case(expertparallel_two_processes 0 "OK: 32 of 32 checks passed" ${EPQ})
# Four ranks (one expert each): the dense gradients are sums of 4 parts, bounded, not bitwise.
cli_case(expertparallel_four_processes 0 "OK: 32 of 32 checks passed" ${EPQ} --nproc 4)
# One process: the all-to-all is a copy; the same checks hold.
cli_case(expertparallel_one_process 0 "OK: 32 of 32 checks passed" ${EPQ} --nproc 1)
# Top-1 (Switch's raw-prob gate) with a capacity factor that drops most tokens.
cli_case(expertparallel_top1_tight 0 "OK: 32 of 32 checks passed" ${EPQ} --set moe.top_k=1
         --set moe.capacity_factor=0.25)
# One method only: its 10 checks and the 2 byte checks.
cli_case(expertparallel_one_method 0 "OK: 12 of 12 checks passed" ${EPQ} --set "moe.balances=[\"aux_free\"]")
# Rank 1 dies (exit 86) or hangs at training step 1, inside the all-to-all: every rank ends within
# the timeout, exit 3, rank 1 named, no result file, no process left.
add_test(NAME cli.expertparallel_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> ${EPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.expertparallel_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
add_test(NAME cli.expertparallel_hung_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> ${EPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.expertparallel_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${EPQ}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.expertparallel_hung_rank cli.expertparallel_deterministic PROPERTIES TIMEOUT 120)
# Two ranks started by hand with torchrun's variables: rank 0 alone prints and writes.
add_test(NAME cli.expertparallel_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> expertparallel
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.expertparallel_torchrun_env PROPERTIES TIMEOUT 180)

# Bad inputs: exit 2 naming the key, before any process starts.
cli_case(expertparallel_experts_not_divisible 2
         "does not fit 3 processes: /moe/experts: expected a multiple of the EP degree e = 3 .*got 4" ${EPQ}
         --nproc 3)
cli_case(expertparallel_top_k_over_experts 2 "/moe/top_k: expected at most /moe/experts = 4, got 5" ${EPQ}
         --set moe.top_k=5)
cli_case(expertparallel_capacity_factor_zero 2 "/moe/capacity_factor" ${EPQ} --set moe.capacity_factor=0)
cli_case(expertparallel_capacity_factor_negative 2 "/moe/capacity_factor" ${EPQ} --set moe.capacity_factor=-1)
cli_case(expertparallel_bad_factor_list 2 "/capacity/factors" ${EPQ} --set "capacity.factors=[1.0, 0]")
cli_case(expertparallel_bad_balance 2 "/moe/balances" ${EPQ} --set "moe.balances=[\"switch\"]")
cli_case(expertparallel_no_experts 2 "/moe/experts" ${EPQ} --set moe.experts=0)
cli_case(expertparallel_bad_degree 2 "/nproc" ${EPQ} --nproc 9)
cli_case(expertparallel_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 2" ${EPQ}
         --set fault.rank=2)
cli_case(expertparallel_fault_step_late 2 "/fault/step: expected a step < /train/steps x the methods" ${EPQ}
         --set fault.rank=1 --set fault.step=18)
cli_case(expertparallel_missing_text 3 "nonexistent" ${EPQ} --set data.text_dir=/nonexistent)

# The mesh (configs/expertparallel_mesh.json: dp 2 x tp 2 with ep 2 inside dp, 4 processes, 4 steps):
# every step the loss and every parameter bitwise equal to the same TP model without DP and EP,
# the EP group's all-to-all bytes equal to the formula.
set(EPM expertparallel --config configs/expertparallel_mesh.json)
cli_case(expertparallel_mesh_dp2_tp2_ep2 0 "OK: 8 of 8 checks passed" ${EPM})
# ep 2 inside dp 2 without TP, with the aux-free bias (loads all-reduced over DP every step).
cli_case(expertparallel_mesh_dp2_ep2_aux_free 0 "OK: 8 of 8 checks passed" ${EPM} --nproc 2 --set mesh.tp=1
         --set mesh.balance=aux_free)
# ep 2 inside dp 4 (expert-DP groups of 2: the experts' gradients summed over them): sums of more
# than two terms across ranks, reported; the byte checks hold.
cli_case(expertparallel_mesh_dp4_ep2 0 "OK: 4 of 4 checks passed" ${EPM} --set mesh.dp=4 --set mesh.tp=1)
# Rank 1 dies at mesh step 1: every rank ends within the timeout, rank 1 named.
add_test(NAME cli.expertparallel_mesh_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> ${EPM} --nproc 2 --set mesh.tp=1
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.expertparallel_mesh_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
# Bad mesh inputs: exit 2 naming the key, before any process starts.
cli_case(expertparallel_mesh_size 2 "/mesh/dp, /mesh/tp: expected dp x tp = the processes \\(2\\), got 2 x 2 = 4" ${EPM}
         --nproc 2)
cli_case(expertparallel_mesh_ep_not_dividing_dp 2 "/mesh/ep: expected a divisor of /mesh/dp = 2 .*got 4" ${EPM}
         --set mesh.ep=4)
cli_case(expertparallel_mesh_tp_not_dividing_heads 2 "/mesh/tp: expected a divisor of /model/heads = 4, got 3" ${EPM}
         --nproc 6 --set mesh.tp=3)
# Training that diverges (lr 1000: NaN by step 4) fails its checks (exit 1, the result written)
# instead of passing them on NaN: a NaN difference or bound, and a NaN on another rank, fail.
add_test(NAME cli.expertparallel_diverged
         COMMAND bash -c "d=$(mktemp -d); \"$0\" expertparallel --config configs/expertparallel_quick.json --set train.lr=1000 --out $d/r.json > $d/log 2>&1; rc=$?; grep -Eq 'trained: loss within .* nan <= 1 +FAILED' $d/log && grep -Eq 'trained: dense gradients within .* nan <= 1 +FAILED' $d/log && [ $rc = 1 ]; s=$?; [ $s = 0 ] && echo ok || cat $d/log; rm -rf $d; exit $s"
                 $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.expertparallel_diverged PROPERTIES TIMEOUT 120)
cli_case(expertparallel_mesh_experts 2 "/moe/experts: expected a multiple of /mesh/ep = 2, got 3" ${EPM}
         --set moe.experts=3)
