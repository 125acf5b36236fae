# CLI cases of `mpt checkpoint` and `mpt accumulate` (issue 6). Tiny configs: seconds each.
set(CKPT_TINY checkpoint --set model.depth=9 --set model.width=16 --set data.batch=64 --set timing.repeats=1)
set(ACC_TINY accumulate --set data.samples=256 --set batch=32 --set "micro_batches=[1,2,4]" --set train.steps=3
             --set memory.batch=64 --set memory.hidden=64 --set "memory.micro_batches=[1,2,4]" --set timing.repeats=1)

# result_case(NAME CHECK ARGS...): runs mpt ARGS and asserts CHECK of tests/cli/result_checks.py on the result.
function(result_case name check)
  add_test(NAME cli.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/result_check.sh $<TARGET_FILE:mpt> ${check} ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.${name} PROPERTIES TIMEOUT 300)
endfunction()

# --- checkpoint ---
cli_case(checkpoint_tiny 0 "OK: [0-9]+ of [0-9]+ checks passed" ${CKPT_TINY})
cli_case(checkpoint_list 0 "checkpoint +Gradient checkpointing" list)
# Fixed model of 16 blocks: peak bytes strictly decreasing for s = 1, 2, 3, 4 = sqrt(16); gradients bitwise equal.
result_case(checkpoint_peak_decreasing checkpoint_peak_decreasing
            checkpoint --set model.depth=16 --set model.width=32 --set data.batch=256 --set timing.repeats=1)
cli_case(checkpoint_fp16 0 "fp16\\): gradients and peak memory" ${CKPT_TINY} --set model.precision=fp16)
result_case(checkpoint_rng_mismatch checkpoint_rng_mismatch ${CKPT_TINY} --set model.dropout=0.5)
add_test(NAME cli.checkpoint_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${CKPT_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
cli_case(checkpoint_bad_segments_zero 2 "/checkpoint/segments/0: expected a segment count between 1 and the number of blocks /model/depth = 9, got 0"
         ${CKPT_TINY} --set "checkpoint.segments=[\"0\"]")
cli_case(checkpoint_bad_segments_too_many 2 "/checkpoint/segments/1: expected a segment count between 1 and the number of blocks /model/depth = 9, got 10"
         ${CKPT_TINY} --set "checkpoint.segments=[\"2\",\"10\"]")
cli_case(checkpoint_bad_segments_word 2 "/checkpoint/segments/0: expected an integer, \"sqrt\" or \"n\", got \"half\""
         ${CKPT_TINY} --set "checkpoint.segments=[\"half\"]")

# --- accumulate ---
cli_case(accumulate_tiny 0 "OK: [0-9]+ of [0-9]+ checks passed" ${ACC_TINY})
result_case(accumulate_normalisation accumulate_normalisation ${ACC_TINY})
result_case(accumulate_batchnorm accumulate_batchnorm ${ACC_TINY})
result_case(accumulate_memory accumulate_memory ${ACC_TINY})
add_test(NAME cli.accumulate_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${ACC_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
cli_case(accumulate_bad_micro_batches 2 "/micro_batches/1: expected at most /batch = 32 micro-batches .*got 64"
         ${ACC_TINY} --set "micro_batches=[2,64]")
cli_case(accumulate_bad_train_micro_batches 2 "/train/micro_batches: expected at most /batch = 32 micro-batches .*got 33"
         ${ACC_TINY} --set train.micro_batches=33)
cli_case(accumulate_bad_micro_batches_zero 2 "/micro_batches/0: expected .*>= 1.*got 0" ${ACC_TINY} --set "micro_batches=[0]")
cli_case(accumulate_missing_data 2 "/data/dir: expected a folder with Fashion-MNIST.*/nonexistent/fashion" ${ACC_TINY} --set data.dir=/nonexistent/fashion)

# Probe defect 3: divergence. At lr 1e20 both runs' losses are nan from step 2: the notes say so, and
# the loss and parameter checks compare nan and fail (exit 1; std::max had shown max|dw| = 0 there).
diverged_case(accumulate_diverged 1 "diverged: one batch's loss became nan at step 2" ${ACC_TINY} --set train.lr=1e20)
# A forward that overflows fp16 (64 blocks of width 256 with dropout 0.9: each block multiplies the
# mean square by about 1/(6(1 - p)) = 1.7): the loss is nan, every gradient difference nan, the checks
# fail (exit 1) and the note says why.
diverged_case(checkpoint_diverged 1 "diverged: the plain step's loss became nan at step 0" checkpoint
              --set model.depth=64 --set model.width=256 --set data.batch=8 --set model.dropout=0.9
              --set model.precision=fp16 --set checkpoint.sweep=false --set timing.repeats=1)
