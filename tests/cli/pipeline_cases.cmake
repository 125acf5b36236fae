# CLI cases for `mpt pipeline` (see cli_case in tests/CMakeLists.txt). Runs use a small synthetic
# cost so each takes well under a second.
set(PIPE_FAST --set cost.forward_us=50 --set "pipeline.microbatches=[1,2,4]")

cli_case(pipeline_default 0 "OK: [0-9]+ of [0-9]+ checks passed" pipeline)
cli_case(pipeline_gantt_title 0 "Timeline 1f1b\\.m4 \\(p = 4, m = 4\\)" pipeline ${PIPE_FAST} --set gantt.microbatches=4)
cli_case(pipeline_gantt_rows 0 "stage 3 \\|\\.+F0" pipeline ${PIPE_FAST} --set gantt.microbatches=4)
cli_case(pipeline_exact_split 0 "k2\\.L1\\.weight .* 0\\.000e\\+00 +yes" pipeline ${PIPE_FAST})
cli_case(pipeline_split3 0 "k3\\.L4\\.bias" pipeline --config configs/pipeline_split3.json ${PIPE_FAST})
# 4 stages on 2 threads (no synthetic cost): every check passes (exit 0: gradients, peaks, the same gradient each step)
cli_case(pipeline_workers 0 "Measured \\(2 threads for the 4 stages, no synthetic cost\\)" pipeline
         --set cost.forward_us=0 --set pipeline.workers=2 --set "pipeline.microbatches=[1,4,8]")
cli_case(pipeline_workers_negative 2 "/pipeline/workers: expected an integer >= 0 and <= 64, got -1" pipeline
         --set pipeline.workers=-1)
cli_case(pipeline_uneven 0 "stage 1 costs 3x" pipeline --config configs/pipeline_uneven.json ${PIPE_FAST})
cli_case(pipeline_spin 0 "1f1b\\.m4" pipeline ${PIPE_FAST} --set cost.mode=spin --set pipeline.stages=2)
# Interleaved 1F1B (v = 2 chunks per stage): the same gradients as GPipe bit for bit, the lower bubble theory.
cli_case(pipeline_interleaved 0 "interleaved-1f1b\\.m8: interleaved-1f1b gradient == gpipe gradient \\(bitwise\\) +0 <= 0 +OK"
         pipeline --config configs/pipeline_interleaved.json --set cost.forward_us=50)
cli_case(pipeline_interleaved_skips_m 0 "interleaved-1f1b skipped for m = 1, 2: not a multiple of p = 4"
         pipeline ${PIPE_FAST} --set "pipeline.schedules=[\"gpipe\",\"interleaved-1f1b\"]")
cli_case(pipeline_interleaved_gantt 0 "Timeline interleaved-1f1b\\.m4 \\(p = 4, m = 4, v = 2. f/b: odd chunks\\)"
         pipeline ${PIPE_FAST} --set gantt.microbatches=4 --set "pipeline.schedules=[\"interleaved-1f1b\"]")
# ZB-H1 (B/W split): GPipe's gradients bit for bit, W ops in the Gantt chart, the zero-bubble table.
cli_case(pipeline_zb_h1 0 "zb-h1\\.m4: zb-h1 gradient == gpipe gradient \\(bitwise\\) +0 <= 0 +OK" pipeline ${PIPE_FAST})
cli_case(pipeline_zb_h1_peak 0 "zb-h1\\.m4: peak microbatches held - bound \\(4\\) +0 <= 0 +OK" pipeline ${PIPE_FAST})
cli_case(pipeline_zb_gantt_title 0 "Timeline zb-h1\\.m4 \\(p = 4, m = 4\\): F/B/W"
         pipeline ${PIPE_FAST} --set gantt.microbatches=4 --set "pipeline.schedules=[\"zb-h1\"]")
# (500 us per layer: the chart is drawn from measured times, and 50 us ops drown in a loaded machine's jitter)
cli_case(pipeline_zb_gantt_rows 0 "stage 3 \\|\\.+F0[^|]*B0[^|]*W0"
         pipeline ${PIPE_FAST} --set cost.forward_us=500 --set gantt.microbatches=4 --set "pipeline.schedules=[\"zb-h1\"]")
cli_case(pipeline_zb_table 0 "Zero bubble: ZB-H1 against 1F1B on 4 stages"
         pipeline ${PIPE_FAST} --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]")
# ZB-V (2 chunks per stage in a V): GPipe's gradients bit for bit, the measured peak per rank min(2p, 2m, m+1+s).
cli_case(pipeline_zb_v 0 "zb-v\\.m4: zb-v gradient == gpipe gradient \\(bitwise\\) +0 <= 0 +OK"
         pipeline ${PIPE_FAST} --set "pipeline.schedules=[\"gpipe\",\"zb-v\"]" --set sync.enabled=false)
cli_case(pipeline_zb_v_peak 0 "zb-v\\.m4: ranks whose measured peak differs from min\\(2p, 2m, m\\+1\\+s\\) +0 <= 0 +OK"
         pipeline ${PIPE_FAST} --set "pipeline.schedules=[\"zb-v\"]" --set sync.enabled=false)
cli_case(pipeline_bad_zb_v_stages 2 "/pipeline/stages: expected at most 4 with zb-v in /pipeline/schedules .*got 5"
         pipeline --set pipeline.stages=5 --set "pipeline.schedules=[\"zb-v\"]")
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
# Under a heavy stage the zero-bubble formula (equal stages) does not apply: '-' and a note say so.
cli_case(pipeline_zb_heavy_formula 0 "idle formula '-': the formula assumes equal stages, and stage 1 costs 3x"
         pipeline ${PIPE_FAST} --set cost.heavy_stage=1 --set cost.heavy_factor=3 --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]")
# No synthetic cost: the time model has no bubble ('-'), never nan.
cli_case(pipeline_zb_no_cost_no_nan 0 "zb-h1\\.m4 +zb-h1 +4( +0){6} +- +4 " pipeline --set cost.forward_us=0 --set "pipeline.microbatches=[4]"
         --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]")
# The step-end barrier (time model): free for 1f1b, 0.5 ms a step for zb-h1 when stage 1 is 3x slower.
cli_case(pipeline_step_sync_heavy 0 "zb-h1\\.m8 +zb-h1 +8 +73 +146 +145 +0\\.5 +0\\.7 +69,73,59,59"
         pipeline --set "pipeline.microbatches=[8]" --set cost.heavy_stage=1 --set cost.heavy_factor=3 --set pipeline.steps=1
         --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]")
cli_case(pipeline_step_sync_free_1f1b 0 "1f1b\\.m8 +1f1b +8 +33 +66 +66 +0 +0\\.0 "
         pipeline --set "pipeline.microbatches=[8]" --set pipeline.steps=1 --set "pipeline.schedules=[\"1f1b\"]")
# The barrier is timed at m = /gantt/microbatches: one that does not divide the batch is refused (was exit 3 mid-run);
# with no schedule it compares, a note says the tables are not there.
cli_case(pipeline_sync_gantt_not_divisor 2 "/gantt/microbatches: expected a divisor of /pipeline/batch \\(64\\) with /sync/enabled"
         pipeline --set gantt.microbatches=3)
cli_case(pipeline_sync_no_schedule_note 0 "step_sync: not timed, /pipeline/schedules has none of gpipe, 1f1b, zb-h1"
         pipeline --set "pipeline.schedules=[\"naive\"]" --set "pipeline.microbatches=[2]" --set gantt.microbatches=2)
cli_case(pipeline_bad_heavy_stage 2 "/cost/heavy_stage: expected -1 or a stage 0 \\.\\. 3, got 4" pipeline --set cost.heavy_stage=4)
cli_case(pipeline_bad_chunks 2 "/pipeline/chunks: expected at most 2 \\(interleaved-1f1b cuts the 8 layers into stages x chunks = 4 x 3 .*got 3"
         pipeline --set "pipeline.schedules=[\"interleaved-1f1b\"]" --set pipeline.chunks=3)
cli_case(pipeline_bad_interleaved_stages 2 "/pipeline/stages: expected at most 4 with interleaved-1f1b .*got 8: use fewer stages"
         pipeline --set "pipeline.schedules=[\"interleaved-1f1b\"]" --set pipeline.stages=8)
cli_case(pipeline_bad_timeout 2 "/pipeline/timeout_s: expected .*<= 3600" pipeline --set pipeline.timeout_s=1e20)
cli_case(pipeline_bad_interleaved_m 2 "/pipeline/microbatches: expected at least one multiple of /pipeline/stages \\(4\\)"
         pipeline --set "pipeline.schedules=[\"interleaved-1f1b\"]" --set "pipeline.microbatches=[1,2]")
cli_case(pipeline_bad_weight_factor 2 "/cost/weight_factor: expected at most /cost/backward_factor \\(2\\): W is a part of the backward, got 3"
         pipeline --set cost.weight_factor=3)
cli_case(pipeline_bad_schedule 2 "/pipeline/schedules/0: expected one of .*got \"gpip\"" pipeline --set "pipeline.schedules=[\"gpip\"]")

# --- one process per stage (/executor = processes): c10d send/recv over Gloo on loopback ---
# Tiny runs (1 timed step, m in {1, 2, 4}): a few seconds each, most of it process start-up.
# Exit 0 means every check passed; the regex makes sure the checks specific to processes ran.
set(PIPE_PROC pipeline --set executor=processes --set cost.forward_us=50 --set "pipeline.microbatches=[1,2,4]"
    --set pipeline.steps=1 --set "split.extra_stages=[3]" --set pipeline.timeout_s=20)
cli_case(pipeline_processes_2 0 "1f1b\\.m4: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2)
cli_case(pipeline_processes_3 0 "gpipe\\.m4: microbatched == full-batch gradient, max abs diff .* OK"
         ${PIPE_PROC} --nproc 3 --set pipeline.stages=3)
cli_case(pipeline_processes_3_title 0 "Measured \\(one process per stage"
         ${PIPE_PROC} --nproc 3 --set pipeline.stages=3 --set "pipeline.schedules=[\"1f1b\"]")
cli_case(pipeline_processes_interleaved 0 "interleaved-1f1b\\.m4: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set "pipeline.schedules=[\"gpipe\",\"interleaved-1f1b\"]")
cli_case(pipeline_processes_zb_h1 0 "zb-h1\\.m4: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set "pipeline.schedules=[\"gpipe\",\"zb-h1\"]")
# ZB-V over Gloo: the V placement on processes (rank 0 holds the loss, rank 1 the turn).
cli_case(pipeline_processes_zb_v 0 "zb-v\\.m4: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set "pipeline.schedules=[\"gpipe\",\"zb-v\"]" --set sync.enabled=false)
cli_case(pipeline_processes_config 0 "naive: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         pipeline --config configs/pipeline_processes.json ${PIPE_FAST} --set pipeline.steps=1
         --set "pipeline.schedules=[\"naive\",\"1f1b\"]")
add_test(NAME cli.pipeline_processes_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${PIPE_PROC} --nproc 2
                 --set pipeline.stages=2 --set "pipeline.schedules=[\"gpipe\",\"1f1b\"]"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.pipeline_processes_torchrun_env
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_env.sh $<TARGET_FILE:mpt> pipeline
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.pipeline_processes_2 cli.pipeline_processes_3 cli.pipeline_processes_3_title
                     cli.pipeline_processes_config cli.pipeline_processes_interleaved cli.pipeline_processes_deterministic
                     cli.pipeline_processes_torchrun_env PROPERTIES TIMEOUT 120)
# A stage process dies in the middle of step 3 (gpipe.m2, after its F0): its neighbours' recv
# fails (connection closed, at the latest the 5 s timeout), every rank exits, mpt names rank 1
# and exits 3. Stage 0 sent F0 and F1 and waits for B0 from the dead stage: it names it.
cli_case(pipeline_processes_dead_stage 3 "rank 1 of 3 failed:? \\(?exit code 86 \\(injected fault\\)"
         ${PIPE_PROC} --nproc 3 --set pipeline.stages=3 --set fault.rank=1 --set fault.step=3
         --set pipeline.timeout_s=5)
cli_case(pipeline_processes_dead_stage_peer 3 "stage 0: no gradient for microbatch 0 from stage 1 \\(rank 1\\)"
         ${PIPE_PROC} --nproc 3 --set pipeline.stages=3 --set fault.rank=1 --set fault.step=3
         --set pipeline.timeout_s=5)
set_tests_properties(cli.pipeline_processes_dead_stage cli.pipeline_processes_dead_stage_peer PROPERTIES TIMEOUT 30)
# Bad input: the process count must be the stage count (exit 2 before any worker starts).
cli_case(pipeline_bad_nproc_stages 2 "/nproc: expected 4 processes with /executor = \"processes\" .*got 2"
         pipeline --set executor=processes --nproc 2)
cli_case(pipeline_bad_nproc_threads 2 "/nproc: expected 1 with /executor = \"threads\" .*got 3" pipeline --nproc 3)
cli_case(pipeline_bad_fault_rank 2 "/fault/rank: expected -1 or a rank 0 \\.\\. 1, got 2"
         pipeline --set executor=processes --set pipeline.stages=2 --nproc 2 --set fault.rank=2)
cli_case(pipeline_bad_executor 2 "/executor: expected one of .*got \"procs\"" pipeline --set executor=procs)
# Issue 38: stage 3 of 4 exits mid-step: stages 2, 1, 0 give up one after the other, each on its
# neighbour, and every one names rank 3 (a neighbour that gave up on rank 3 and exited is followed
# to rank 3, not blamed as "stopped (SIGSTOP?) or dead").
add_test(NAME cli.pipeline_processes_killed_rank_named
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/killed_rank_named.sh $<TARGET_FILE:mpt> pipeline
                 --set executor=processes --set pipeline.stages=4 --nproc 4 --set pipeline.steps=3
                 --set "pipeline.microbatches=[4]" --set "pipeline.schedules=[\"1f1b\"]"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.pipeline_processes_killed_rank_named PROPERTIES TIMEOUT 120
                     ENVIRONMENT "FAULT_MODE=exit;TIMEOUT_KEY=pipeline.timeout_s")
# Issue 15: a stage process stopped (SIGSTOP) mid-run: rank 1 named (not rank 0, which waited for
# it) within about pipeline.timeout_s; a sub-second timeout works (it was truncated to 0 s).
add_test(NAME cli.pipeline_processes_stopped_stage
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/stopped_rank.sh $<TARGET_FILE:mpt> pipe_stop
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.pipeline_processes_stopped_stage PROPERTIES TIMEOUT 120)
cli_case(pipeline_processes_subsecond_timeout 0 "1f1b\\.m4: processes gradient == threads gradient \\(bitwise\\) +0 <= 0 +OK"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set pipeline.timeout_s=0.5)
set_tests_properties(cli.pipeline_processes_subsecond_timeout PROPERTIES TIMEOUT 120)
# zb-h1's bubble formula needs W <= F + B: weight_factor above (1 + backward_factor) / 2 is refused with it
cli_case(pipeline_zb_weight_beyond_f_plus_b 2 "/cost/weight_factor: expected at most \\(1 \\+ /cost/backward_factor\\) / 2 = 1.5 with zb-h1"
         pipeline --set "pipeline.schedules=[\"1f1b\",\"zb-h1\"]" --set cost.weight_factor=1.6)
cli_case(pipeline_duplicate_schedule 2 "/pipeline/schedules/1: expected each value once, got \"1f1b\" again"
         pipeline --set "pipeline.schedules=[\"1f1b\",\"1f1b\"]")
cli_case(pipeline_duplicate_microbatches 2 "/pipeline/microbatches/1: expected each value once, got 4 again"
         pipeline --set "pipeline.microbatches=[4,4]")
# Probe defect 2: a /fault/step beyond the run's last step (the fault never fired and the run "passed"):
# exit 2 naming it. PIPE_PROC on 2 stages runs 1 warm-up + naive 1 + (gpipe, 1f1b, zb-h1) x m in {1,2,4}
# x 1 step = 9, + /sync/enabled 2 x 1 step per gpipe, 1f1b, zb-h1 = 6: 17 steps, 0 .. 16.
cli_case(pipeline_fault_step_beyond 2 "/fault/step: expected a step 0 \\.\\. 16 \\(the run's last step.*got 17"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set fault.rank=1 --set fault.step=17)
# ... and step 16 (the last of the step-end synchronisation) is reached: the stage dies there (exit 3).
cli_case(pipeline_fault_step_last 3 "rank 1 of 2 failed:? \\(?exit code 86 \\(injected fault\\)"
         ${PIPE_PROC} --nproc 2 --set pipeline.stages=2 --set fault.rank=1 --set fault.step=16 --set pipeline.timeout_s=5)
set_tests_properties(cli.pipeline_fault_step_last PROPERTIES TIMEOUT 60)
# Probe (stop 27): a sweep without m = /gantt/microbatches drew no chart and said nothing.
cli_case(pipeline_gantt_m_not_swept 0 "no Gantt chart for the schedules but naive: they are drawn at /gantt/microbatches = 8"
         pipeline --set "pipeline.microbatches=[2]" --set cost.forward_us=0 --set pipeline.steps=1)
