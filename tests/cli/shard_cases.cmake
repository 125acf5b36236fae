# CLI cases of `mpt shard` (see cli_case in tests/CMakeLists.txt). Tiny config:
# configs/shard_quick.json trains 4 steps of a 784-32-10 MLP on 2 ranks, 2 micro-batches each.
set(SHQ shard --config configs/shard_quick.json)

# Two processes over loopback: every stage equals DDP and one process bitwise, bytes = formulas.
cli_case(shard_two_processes 0 "OK: 10 of 10 checks passed" ${SHQ})
# One process: the collectives are copies; every stage equals LibTorch's own Adam bitwise.
cli_case(shard_one_process 0 "OK: [0-9]+ of [0-9]+ checks passed" ${SHQ} --nproc 1)
# SGD with momentum (a 4-byte state), bf16 compute with fp32 reduction as the training runs.
cli_case(shard_sgd_bf16 0 "OK: [0-9]+ of [0-9]+ checks passed" ${SHQ} --set optimizer.name=sgd
         --set optimizer.momentum=0.9 --set optimizer.lr=0.05 --set mixed.param_dtype=bf16)
# DeepSpeed's reduce-scatter after every micro-batch (stages 2-3), with FSDP2's order as the extra row.
cli_case(shard_reduce_every_micro_batch 0 "stage2_reduce_after_last" ${SHQ} --set zero.reduce_every_micro_batch=true)
# Three ranks: dim-0 chunks do not divide (32 and 10 rows over 3: padding), sums of 3 terms.
cli_case(shard_three_processes 0 "OK: [0-9]+ of [0-9]+ checks passed" ${SHQ} --nproc 3 --set train.global_batch=18
         --set train.samples=288)
# Four ranks (issue 19's N > 2 equivalence): Gloo adds the 4 terms in its own order, so every gradient
# reduction of stages 0, 2 and 3 is checked against the float64 sum of the same terms within
# (g_3 + g64_3) sum|t| (dist::reduction_error); a reduction that drops a rank's terms exits 1.
cli_case(shard_four_processes_bound 0 "OK: 5 of 5 checks passed" ${SHQ} --nproc 4 --set train.steps=2
         --set "train.stages=[0,2,3]" --set "model.hidden=[8]" --set mixed.compare=false
         --set zero.compare_every_micro_batch=false)
# A rank dies at step 1 (exit 86 mid-step): every rank ends within the timeout, exit 3, rank 1 named
# with its exit code, no result file, no process left (hung_rank.sh in its exit mode).
add_test(NAME cli.shard_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> shard --config configs/shard_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.shard_killed_rank PROPERTIES TIMEOUT 120 ENVIRONMENT FAULT_MODE=exit)
# Bad inputs: exit 2 naming the keys, before any process starts.
cli_case(shard_bad_stage 2 "/train/stages.*expected.*<= 3" shard --set "train.stages=[0,4]")
# dist.gloo_algorithm is "native" or "ring": a bad value in a file names the file, the pointer and both values.
cli_case(shard_bad_gloo_algorithm 2
         "bad_gloo_algorithm.json: /dist/gloo_algorithm: expected one of .*\"native\".*\"ring\".*got \"rign\""
         shard --config tests/cli/bad/bad_gloo_algorithm.json)
# The ring on LibTorch 2.x too (1.13 runs it for reduce-scatter anyway): every check still holds at N = 2.
cli_case(shard_gloo_ring 0 "OK: 10 of 10 checks passed" ${SHQ} --set dist.gloo_algorithm=ring)
# The ring on 3 ranks (2 ring steps, padded chunks), bf16 parameters (the all-gather as bytes, in
# place in its output) and a reduce-scatter after every micro-batch: every check still holds.
cli_case(shard_gloo_ring_three_bf16 0 "OK: [0-9]+ of [0-9]+ checks passed" ${SHQ} --nproc 3 --set dist.gloo_algorithm=ring
         --set train.global_batch=18 --set train.samples=288 --set mixed.param_dtype=bf16
         --set zero.reduce_every_micro_batch=true)
cli_case(shard_batch_not_multiple 2 "/train/global_batch: expected a multiple of N x /train/micro_batches = 2 x 2"
         ${SHQ} --set train.global_batch=18)
cli_case(shard_stage3_param_too_small 2 "/model/hidden: stage 3 .* over N = 4 ranks: expected every width >= 4, got 2"
         ${SHQ} --nproc 4 --set "model.hidden=[2]")
cli_case(shard_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 2" ${SHQ} --set fault.rank=2)
cli_case(shard_too_few_samples 2 "/train/samples: expected at least /train/steps x /train/global_batch" ${SHQ}
         --set train.samples=32)
cli_case(shard_bad_dtype 2 "/mixed/param_dtype" ${SHQ} --set mixed.param_dtype=fp16)

add_test(NAME cli.shard_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> shard
                 --config configs/shard_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# A rank hangs (alive but silent) at step 1: rank 0 names rank 1, every rank ends, nothing left running.
add_test(NAME cli.shard_hung_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hung_rank.sh $<TARGET_FILE:mpt> shard --config configs/shard_quick.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) instead of --nproc.
add_test(NAME cli.shard_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> shard
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# Ranks started with different --set, and two processes started as rank 1: named, exit 2 (they
# were collective timeouts in which each rank blamed the other; found by the stop-27 probe).
add_test(NAME cli.shard_env_mismatch
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> mismatch
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.shard_deterministic cli.shard_hung_rank cli.shard_torchrun_env cli.shard_env_mismatch
                     PROPERTIES TIMEOUT 120)
# torch.optim.Adam's betas are in [0, 1): beta = 1 is a config error, not a LibTorch error after the spawn
cli_case(shard_bad_beta1 2 "/optimizer/beta1: expected a number >= 0 and < 1, got 1" ${SHQ} --set optimizer.beta1=1)
cli_case(shard_duplicate_stage 2 "/train/stages/1: expected each value once, got 1 again" ${SHQ} --set "train.stages=[1,1]")

# The tiny GPT (issue 19): a 1-block GPT of width 16 on the fortunes text, 2 ranks, stages 0-3,
# 2 micro-batches, the bf16 policies: every stage equals DDP and one process bitwise (N = 2),
# bytes = formulas. Its config's documented twin is configs/shard_gpt.json.
set(SHG shard --config configs/shard_quick.json --set model.name=gpt --set model.gpt.layers=1 --set model.gpt.width=16
    --set model.gpt.heads=2 --set model.gpt.context=8 --set train.global_batch=8 --set train.steps=3)
cli_case(shard_gpt_two_processes 0 "OK: 10 of 10 checks passed" ${SHG})
# Three ranks: sums of 3 terms (vs DDP reported); stages 1, 2 and 3 (one reduce-scatter of the same buffer)
# checked bitwise equal; 16, 8 and V rows over 3 (padding).
# Since the N > 2 bound: + 1 check per run (5 fp32 runs, 3 mixed; LibTorch 1.13: 2 mixed, no bf16 reduction),
# every reduction within its bound: 12 checks, 11 on Debian's route.
cli_case(shard_gpt_three_processes 0 "OK: 1[12] of 1[12] checks passed" ${SHG} --nproc 3 --set train.global_batch=12)
# Bad inputs of the GPT: exit 2 naming the keys, before any process starts.
cli_case(shard_gpt_heads_not_dividing 2 "/model/gpt/heads: expected a divisor of /model/gpt/width \\(16\\), got 3"
         ${SHG} --set model.gpt.heads=3)
cli_case(shard_gpt_stage3_context_too_small 2
         "/model/gpt/context: stage 3 .* shards every GPT parameter along dim 0 over N = 4 ranks: expected >= 4, got 2"
         ${SHG} --nproc 4 --set model.gpt.context=2)
cli_case(shard_gpt_stage3_width_too_small 2 "/model/gpt/width: stage 3 .* over N = 3 ranks: expected >= 3, got 2"
         ${SHG} --nproc 3 --set train.global_batch=12 --set model.gpt.width=2 --set model.gpt.heads=1)
cli_case(shard_gpt_no_text_files 2 "/data/text_files: expected a list of strings \\(non-empty\\), got \\[\\]" ${SHG} --set "data.text_files=[]")
# The GPT's results are deterministic too (same seed: the same batches, weights and sums).
add_test(NAME cli.shard_gpt_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${SHG}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.shard_gpt_deterministic PROPERTIES TIMEOUT 120)
# Stage 3 over 5 ranks, a corpus of 4 characters (tests/cli/text/four_chars: a, b, space, newline):
# wte and lm_head have V = 4 rows — exit 2 naming the text files, before any process starts.
cli_case(shard_gpt_stage3_vocab_too_small 2
         "/data/text_files: stage 3 shards wte and lm_head \\(4 rows.*over N = 5 ranks: expected a vocabulary of >= 5, got 4"
         ${SHG} --nproc 5 --set train.global_batch=20 --set data.text_dir=tests/cli/text --set "data.text_files=[\"four_chars\"]")
# The GPT with SGD + momentum, bf16 compute (fp32 reduction) in the training runs; and DeepSpeed's
# reduce-scatter after every micro-batch (stage 3 = stage 2 bitwise, checked).
cli_case(shard_gpt_sgd_bf16 0 "OK: 6 of 6 checks passed" ${SHG} --set optimizer.name=sgd --set optimizer.momentum=0.9
         --set optimizer.lr=0.05 --set mixed.param_dtype=bf16)
cli_case(shard_gpt_reduce_every_micro_batch 0 "stage3 vs stage2, reducing every micro-batch: .* OK" ${SHG}
         --set zero.reduce_every_micro_batch=true)
# A context as long as the training text: exit 2 naming the key before any spawn (was exit 3 in every rank).
cli_case(shard_gpt_context_beyond_text 2 "/model/gpt/context: expected fewer tokens than the training split of /data/text_files \\(121 of 135 characters.*got 125"
         ${SHG} --set model.gpt.context=125 --set data.text_dir=tests/cli/text --set "data.text_files=[\"four_chars\"]")
# Rank 0 computes the one-process references for seconds while rank 1 waits (timeout 2 s): the group
# forms first, so rank 0's heartbeat says it is working and rank 1 waits (was: killed as "never started").
cli_case(shard_gpt_busy_rank0_waited_for 0 "OK: 10 of 10 checks passed" ${SHG} --set model.gpt.context=1024 --set dist.timeout_s=2)

# Probe defects. 3: divergence. At lr 1e20 the loss of every run is nan from step 1: the equivalence
# checks compare nan parameters and fail (a nan on either side is a mismatch: exit 1), the notes
# name each run and the step, and the mixed-precision table's max|dloss| is nan, not the finite
# maximum of step 0 (std::max drops a nan).
diverged_case(shard_diverged 1 "diverged: stage0's loss became nan at step 1" ${SHQ} --set optimizer.lr=1e20
              --set "train.stages=[0,1]" --set zero.compare_every_micro_batch=false)
# 5: a directory or an empty file in the GPT's text file list: exit 2 naming the entry, before any spawn.
cli_case(shard_gpt_text_directory 2 "/data/text_files/0: expected a text file .*tests/cli/text is a directory"
         ${SHG} --set data.text_dir=tests/cli --set "data.text_files=[\"text\"]")
cli_case(shard_gpt_text_empty 2 "/data/text_files/1: expected a text file .*tests/cli/text/empty is empty"
         ${SHG} --set data.text_dir=tests/cli/text --set "data.text_files=[\"four_chars\",\"empty\"]")
# 2 (sibling): /fault/step beyond the run was already refused here; 4: --print-config refuses it too.
cli_case(shard_print_config_fault_step 2 "/fault/step: expected a step < /train/steps = 4, got 4" ${SHQ}
         --set fault.rank=1 --set fault.step=4 --print-config)

# Multi-node (issue 19): two "nodes" x 2 ranks in two network namespaces joined by a veth pair, one
# torchrun agent per node, MASTER_ADDR on node 0's veth (tests/cli/multinode.sh). The results equal a
# one-node --nproc 4 run bitwise; rank 3 (node 1) killed at step 1: every rank of both nodes exits
# non-zero within the timeout, rank 3 named. Skipped (77) naming the step where namespaces cannot be made.
add_test(NAME cli.shard_two_nodes
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/multinode.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON} shard
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.shard_two_nodes_killed_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/multinode.sh $<TARGET_FILE:mpt> ${MPT_REF_PYTHON} fault
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.shard_two_nodes cli.shard_two_nodes_killed_rank PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
# Two ranks started by hand (torchrun's variables, no agent): rank 0 hosts the store and is stopped
# mid-run; rank 1 ends with exit 3 within the bound, saying the store did not answer (it hung
# until killed: LibTorch's TCPStore check() has no receive timeout; found by the stop-27 probe).
add_test(NAME cli.shard_store_host_stopped
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stopped_rank.sh $<TARGET_FILE:mpt> store_stop
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.shard_store_host_stopped PROPERTIES TIMEOUT 120)
