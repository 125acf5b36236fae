# CLI cases of `mpt tensorparallel` (see cli_case in tests/CMakeLists.txt). Tiny config:
# configs/tensorparallel_quick.json: a one-block GPT of width 32, 4 heads, vocabulary 33 (odd:
# padded to 34 on TP = 2), 2 sequences of 16 tokens; an MLP 16-32-8.
set(TPQ tensorparallel --config configs/tensorparallel_quick.json)

# TP = 2 over loopback: the MLP and every GPT operation equal one process (bitwise or within the
# derived bound), SP equals TP, LayerNorm gradients identical across ranks — with Megatron's default
# padding (make_vocab_size_divisible_by = 128): 33 -> 256, rank 1 holding padding only. (The
# default quick config, 33 padded to 34 on t = 2, is golden.tensorparallel's; this case took over
# tensorparallel_vocab_pad_128, which ran the same two processes again, to pay for the mesh cases.)
cli_case(tensorparallel_two_processes 0 "OK: 15 of 15 checks passed" ${TPQ} --set model.vocab_divisible_by=128)
# One process: every collective is a copy; the same checks hold.
cli_case(tensorparallel_one_process 0 "OK: [0-9]+ of [0-9]+ checks passed" ${TPQ} --nproc 1)
# Four ranks: one head per rank, vocabulary 33 padded to 36 (the last rank holds 6 real ids of 9).
cli_case(tensorparallel_four_processes 0 "OK: [0-9]+ of [0-9]+ checks passed" ${TPQ} --nproc 4)
# A rank dies at step 1 (exit 86 mid-step): every rank ends within the timeout, exit 3, rank 1 named
# with its exit code, no result file, no process left (hung_rank.sh in its exit mode).
add_test(NAME cli.tensorparallel_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> tensorparallel --config configs/tensorparallel_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.tensorparallel_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
# Bad inputs: exit 2 naming the keys, before any process starts.
# The world size came from --nproc, not the config file: the message says so (probe, stop 32).
cli_case(tensorparallel_heads_not_divisible 2
         "/model/heads: expected a multiple of the TP degree t = 3 .*got 4 \\[/nproc = 3 from --nproc 3\\]" ${TPQ}
         --nproc 3 --set model.width=48 --set mlp.hidden=48 --set data.seq=15)
cli_case(tensorparallel_heads_not_divisible_set_nproc 2
         "/model/heads: expected a multiple of the TP degree t = 3 .*got 4 \\[/nproc = 3 from --set 'nproc=3'\\]"
         ${TPQ} --set nproc=3 --set model.width=48 --set mlp.hidden=48 --set data.seq=15)
cli_case(tensorparallel_mlp_not_divisible 2 "/mlp/hidden: expected a multiple of the TP degree t = 2" ${TPQ}
         --set mlp.hidden=33)
cli_case(tensorparallel_seq_not_divisible 2 "/data/seq: sequence parallelism .* expected a multiple of 2, got 15"
         ${TPQ} --set data.seq=15)
cli_case(tensorparallel_bad_degree 2 "/nproc" ${TPQ} --nproc 9)
cli_case(tensorparallel_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 2" ${TPQ}
         --set fault.rank=2)

add_test(NAME cli.tensorparallel_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> tensorparallel
                 --config configs/tensorparallel_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# A rank hangs (alive but silent) in the timed steps: rank 0 names rank 1, every rank ends, nothing left running.
add_test(NAME cli.tensorparallel_hung_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> tensorparallel
                 --config configs/tensorparallel_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.tensorparallel_deterministic cli.tensorparallel_hung_rank PROPERTIES TIMEOUT 120)
# Two ranks started by hand with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...): rank 0 alone prints and writes.
add_test(NAME cli.tensorparallel_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> tensorparallel
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.tensorparallel_torchrun_env PROPERTIES TIMEOUT 180)

# The DP x TP x PP mesh (/mesh/steps > 0: the mesh section alone) on the quick GPT with 2 blocks:
# every step's parameters bitwise equal to TP on its TP group without pipeline and DP.
set(TPMESH ${TPQ} --set model.layers=2 --set mesh.steps=2)
cli_case(tensorparallel_mesh_dp2_pp2 0 "OK: 2 of 2 checks passed" ${TPMESH} --nproc 4 --set mesh.dp=2 --set mesh.pp=2)
cli_case(tensorparallel_mesh_tp2_pp2 0 "OK: 2 of 2 checks passed" ${TPMESH} --nproc 4 --set mesh.tp=2 --set mesh.pp=2
         --set mesh.schedule=gpipe)
# 2 x 2 x 2 = 8 processes, the documented config.
cli_case(tensorparallel_mesh8 0 "OK: 2 of 2 checks passed" tensorparallel --config configs/tensorparallel_mesh8.json)
# Context parallelism in the mesh (/mesh/cp = 2): every step's parameters bitwise equal to TP and CP
# on their groups without pipeline and DP; dp 2 x cp 2 x tp 2 = 8 processes (the documented
# config, the ring on the balanced split), cp 2 x pp 2 with each attention on the contiguous split.
cli_case(tensorparallel_mesh_cp8 0 "OK: 2 of 2 checks passed" tensorparallel --config configs/tensorparallel_mesh_cp8.json)
cli_case(tensorparallel_mesh_cp2_pp2_ulysses 0 "OK: 2 of 2 checks passed" ${TPMESH} --nproc 4 --set mesh.cp=2
         --set mesh.pp=2 --set mesh.cp_attention=ulysses --set mesh.cp_split=contiguous)
cli_case(tensorparallel_mesh_dp2_cp2_all_gather 0 "OK: 2 of 2 checks passed" ${TPMESH} --nproc 4 --set mesh.cp=2
         --set mesh.dp=2 --set mesh.cp_attention=all_gather)
cli_case(tensorparallel_mesh_cp_seq 2 "/data/seq: expected a multiple of 4 \\(the balanced split over /mesh/cp = 2\\), got 14"
         ${TPMESH} --nproc 2 --set mesh.cp=2 --set data.seq=14)
cli_case(tensorparallel_mesh_cp_ulysses_heads 2 "/mesh/cp: expected a divisor of the heads per TP rank .* = 1"
         ${TPMESH} --nproc 8 --set mesh.cp=2 --set mesh.tp=4 --set mesh.cp_attention=ulysses)
# A mesh that diverges says so (stop-28 probe: no note, no results.diverged); its checks fail (exit 1).
diverged_case(tensorparallel_mesh_diverged 1 "diverged: mesh's loss became nan at step [0-9]+" ${TPMESH} --nproc 2
         --set mesh.dp=2 --set mesh.steps=10 --set mesh.lr=100)
# Rank 3 of the 4-process dp 2 x pp 2 mesh killed (SIGKILL) at step 1: every other rank's error names
# rank 3 or says it cannot tell, none blames a rank that only gave up on rank 3 (issue 38: rank 0
# blamed rank 2, which had exited after naming rank 3, as "stopped (SIGSTOP?) or dead").
add_test(NAME cli.tensorparallel_mesh_killed_rank_named
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/killed_rank_named.sh $<TARGET_FILE:mpt> ${TPMESH}
                 --set mesh.steps=4 --nproc 4 --set mesh.dp=2 --set mesh.pp=2
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.tensorparallel_mesh_killed_rank_named PROPERTIES TIMEOUT 120)
# Bad mesh input: exit 2 naming the keys, before any process starts.
cli_case(tensorparallel_mesh_world_mismatch 2 "/mesh: expected /mesh/dp x /mesh/cp x /mesh/tp x /mesh/pp = the world size 4"
         ${TPMESH} --nproc 4 --set mesh.dp=2)
cli_case(tensorparallel_mesh_tp_heads 2 "/mesh/tp: expected a divisor of /model/heads = 4" ${TPMESH} --nproc 3
         --set mesh.tp=3)
cli_case(tensorparallel_mesh_pp_layers 2 "/mesh/pp: expected a divisor of /model/layers = 2" ${TPMESH} --nproc 3
         --set mesh.pp=3 --set mesh.microbatches=3 --set data.batch=3)
cli_case(tensorparallel_mesh_microbatches 2 "/mesh/microbatches: expected at least /mesh/pp = 2" ${TPMESH} --nproc 2
         --set mesh.pp=2 --set mesh.microbatches=1)
