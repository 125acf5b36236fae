# CLI cases for `mpt pipeline` (see cli_case in tests/CMakeLists.txt). Runs use a small synthetic
# cost so each takes well under a second.
set(PIPE_FAST --set cost.forward_us=50 --set "pipeline.microbatches=[1,2,4]")

cli_case(pipeline_default 0 "OK: [0-9]+ of [0-9]+ checks passed" pipeline)
cli_case(pipeline_gantt_title 0 "Timeline 1f1b\\.m4 \\(p = 4, m = 4\\)" pipeline ${PIPE_FAST} --set gantt.microbatches=4)
cli_case(pipeline_gantt_rows 0 "stage 3 \\|\\.+F0" pipeline ${PIPE_FAST} --set gantt.microbatches=4)
cli_case(pipeline_exact_split 0 "k2\\.L1\\.weight .* 0\\.000e\\+00 +yes" pipeline ${PIPE_FAST})
cli_case(pipeline_split3 0 "k3\\.L4\\.bias" pipeline --config configs/pipeline_split3.json ${PIPE_FAST})
cli_case(pipeline_uneven 0 "stage 1 costs 3x" pipeline --config configs/pipeline_uneven.json ${PIPE_FAST})
cli_case(pipeline_spin 0 "1f1b\\.m4" pipeline ${PIPE_FAST} --set cost.mode=spin --set pipeline.stages=2)
add_test(NAME cli.pipeline_deterministic_results
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> pipeline ${PIPE_FAST}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- bad input: exit 2 with a message naming the key ---
cli_case(pipeline_bad_cut_outside 2 "/split/cuts/0: expected a cut between layers, 1 \\.\\. 3 .*got 4: outside the model"
         pipeline --set "split.cuts=[4]")
cli_case(pipeline_bad_cut_order 2 "/split/cuts/1: expected cuts in strictly increasing order" pipeline --set "split.cuts=[2,1]")
cli_case(pipeline_bad_zero_microbatches 2 "/pipeline/microbatches/0: expected .*>= 1.*got 0" pipeline --set "pipeline.microbatches=[0]")
cli_case(pipeline_bad_too_many_stages 2 "/pipeline/stages: expected at most 8 .*got 9: more stages than layers"
         pipeline --set pipeline.stages=9)
cli_case(pipeline_bad_split_stages 2 "/split/extra_stages/0: expected at most 4 stages .*more stages than layers"
         pipeline --set "split.extra_stages=[5]")
cli_case(pipeline_bad_not_divisible 2 "/pipeline/microbatches/1: expected a divisor of /pipeline/batch \\(64\\) .*got 3"
         pipeline --set "pipeline.microbatches=[1,3]")
cli_case(pipeline_bad_heavy_stage 2 "/cost/heavy_stage: expected -1 or a stage 0 \\.\\. 3, got 4" pipeline --set cost.heavy_stage=4)
cli_case(pipeline_bad_schedule 2 "/pipeline/schedules/0: expected one of .*got \"gpip\"" pipeline --set "pipeline.schedules=[\"gpip\"]")
