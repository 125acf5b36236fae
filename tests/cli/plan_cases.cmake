# `mpt plan` CLI cases (see cli_case in tests/CMakeLists.txt): pure arithmetic, no processes.
cli_case(plan_defaults 0 "fits the 79.6 GiB of a device" plan)
cli_case(plan_search 0 "1824 layouts tried: [0-9]+ fit" plan --search 1024)
# Published runs: ZeRO Figure 1 within 2 %, Megatron-LM's Table 1, BLOOM-176B, Llama 3 405B's Table 4 and NVIDIA dgxc-benchmarking's H100 rows within 10 %
# (each a check).
cli_case(plan_published 0 "OK: 21 of 21 checks passed" plan --set published=true)
cli_case(plan_gpt3_on_a100 0 "gpt3-175b" plan --set model.preset=gpt3-175b --set system=a100-80gb-dgx
         --set layout.pp=8 --set layout.dp=8 --set train.global_batch=1536 --set train.recipe=fp16)
# Nothing fits: 405B on 8 devices; the closest layouts and how much each misses by.
cli_case(plan_search_nothing_fits 0 "NOTHING FITS: the rows are the closest layouts" plan --set model.preset=llama3-405b --search 8)
# bad input: exit 2 naming the keys
cli_case(plan_bad_tp 2 "/model/heads = 64 is not a multiple of /layout/tp = 3" plan --set layout.tp=3)
cli_case(plan_bad_layers 2 "/model/layers = 80 is not a multiple of /layout/pp · /layout/virtual_stages = 3 · 1" plan --set layout.pp=3)
cli_case(plan_bad_batch 2 "/train/global_batch = 510 is not a multiple of /layout/dp · /train/microbatch = 4 · 1" plan
         --set train.global_batch=510)
# Uneven stages (Megatron-core's num_layers_in_first/last_pipeline_stage, account_for_embedding/loss_in_pipeline_split):
# the two ends' layers must leave the middle stages whole ones, at least one each; Llama 3 405B's 126 + 2 on 16 stages.
cli_case(plan_bad_stage_sum 2 "/layout/first_stage_layers \\+ /layout/last_stage_layers = 30 \\+ 30 = 60: expected /model/layers = 80"
         plan --set layout.pp=2 --set layout.first_stage_layers=30 --set layout.last_stage_layers=30)
# A choice given as another type names its values (config.cpp): `true` for "on".
cli_case(plan_bad_choice_type 2 "/model/dropout: expected a string, one of \"preset\", \"on\", \"off\", got a boolean true" plan
         --set model.dropout=true)
cli_case(plan_bad_stage_empty 2 "leave 0 of /model/layers = 80 for the other 2 stage.*a stage would hold no layer" plan
         --set layout.pp=4 --set layout.first_stage_layers=40 --set layout.last_stage_layers=40)
cli_case(plan_llama3_405b_uneven 0 "uneven stages: first 7, middle 8, last 7 layers" plan --set model.preset=llama3-405b
         --set layout.pp=16 --set layout.dp=64 --set layout.schedule=interleaved-1f1b --set layout.virtual_stages=8
         --set layout.account_for_embedding=true --set layout.account_for_loss=true --set train.global_batch=2048)
# --search refuses as the plain plan does a model whose smallest layout needs 2^53 bytes or more
cli_case(plan_search_too_big 2 "/model: the smallest layout of the search needs 1.97e\\+16 bytes per device, more than the 2\\^53" plan
         --set model.preset=custom --set model.style=mlp --set "model.widths=[16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216,16777216]"
         --set train.recipe=fp32 --search 8)
# a number below the smallest double would read as 0 (core/io/config_json): refused, naming where
cli_case(plan_bad_underflow 2 "/train/tokens: expected a number that is 0 or at least 4.9e-324 in magnitude.*got 1e-400" plan
         --set train.tokens=1e-400)
cli_case(plan_bad_custom 2 "/model/style: expected \"gpt\" or \"llama\" for /model/preset = custom" plan --set model.preset=custom)
cli_case(plan_bad_system_name 2 "/system: no shipped system named \"h300\" \\(expected one of: a100-80gb-dgx, ci-epyc-2cpu, h100-sxm-dgx, h200-sxm-dgx"
         plan --set system=h300)
cli_case(plan_bad_system_file 2 "tests/cli/bad/plan_system_missing.json: /inter_node/all_reduce/busbw_gbps: missing" plan
         --set system=tests/cli/bad/plan_system_missing.json)
cli_case(plan_bad_system_zero 2 "/memory_gib: expected a number in \\[1e-06, 1e\\+06\\], got 0" plan --set system=tests/cli/bad/plan_system_zero.json)
cli_case(plan_no_fp8_on_a100 2 "the system \"a100-80gb-dgx\" .* has no fp8-tensorwise peak" plan --set system=a100-80gb-dgx
         --set train.recipe=fp8-tensorwise)
# fp4 (nvfp4, mxfp4) needs the system's optional peak_tflops.fp4, which no shipped system lists
cli_case(plan_no_fp4_on_h100 2 "the system \"h100-sxm-dgx\" .* has no nvfp4 peak \\(its peak_tflops lists 0 or no fp4\\)" plan
         --set system=h100-sxm-dgx --set train.recipe=nvfp4)
# The plan against mpt's own runs (tests/plan/own_runs.py): shard's model states per rank at ZeRO
# 0-3, tensorparallel's activation bytes per layer, the collectives' payloads, and the MLP experiments'
# (accumulate, checkpoint, dataparallel, pipeline) peaks and payloads, each equal to the plan's term plus
# its named difference (docs/plan.md, "Own runs").
add_test(NAME cli.plan_own_runs COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/plan/own_runs.py $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# --calibrate: this machine from a `mpt collectives` result, then a plan on the system it wrote
add_test(NAME cli.plan_calibrate COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/plan_calibrate.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
cli_case(plan_calibrate_no_collectives 2 "/calibrate/collectives: /nonexistent/c.json: no such file \\(run `mpt collectives --out /nonexistent/c.json` first"
         plan --calibrate --set calibrate.collectives=/nonexistent/c.json)
cli_case(plan_system_not_calibrated 2 "/system: tests/golden/torch2/plan.json is a plan result without timings.system"
         plan --set system=tests/golden/torch2/plan.json)
# A plan beyond 2^53 bytes per device is refused naming the keys, never printed as a wrapped integer.
cli_case(plan_bad_huge 2 "/model: this layout needs .* bytes per device, more than the 2\\^53" plan --set model.sequence=16777216
         --set train.flash_attention=false --set train.recompute=none --set train.microbatch=32)
cli_case(plan_calibrate_directory 2 "/calibrate/collectives: tests: not a regular file" plan --calibrate --set calibrate.collectives=tests)
cli_case(plan_print_config_calibrate 2 "/calibrate/collectives: /nonexistent/c.json: no such file" plan --print-config --calibrate
         --set calibrate.collectives=/nonexistent/c.json)
# Mixture of experts (layout.ep, model.experts / top_k, train.capacity_factor): Mixtral 8x7B with
# ep 8 inside dp 8 and tp 8 fits an 80 GB device, its all-to-all on the ep group; bad input exits 2
# naming the key.
cli_case(plan_mixtral_ep8 0 "ep/all_to_all" plan --set model.preset=mixtral-8x7b --set layout.dp=8 --set layout.ep=8
         --set layout.tp=8)
cli_case(plan_ep_not_dividing_dp 2 "/layout/ep = 3 does not divide /layout/dp = 4" plan --set model.preset=mixtral-8x7b
         --set layout.ep=3)
cli_case(plan_top_k_over_experts 2 "/model/top_k: expected 1 .. /model/experts = 8 for a mixture of experts, got 9" plan
         --set model.preset=mixtral-8x7b --set model.top_k=9)
cli_case(plan_capacity_factor_zero 2 "/train/capacity_factor: expected a number > 0" plan --set model.preset=mixtral-8x7b
         --set train.capacity_factor=0)
# The MLP (model.style mlp, model.widths): mpt pipeline's network on 4 stages, each stage planned with its
# own layers (the mlp_stages table); a layout it cannot run exits 2 naming the key.
cli_case(plan_mlp_pipeline 0 "Model: MLP 16-64-64-64-64-64-64-64-1" plan --set model.preset=custom --set model.style=mlp
         --set "model.widths=[16,64,64,64,64,64,64,64,1]" --set train.recipe=fp32 --set train.global_batch=64
         --set train.microbatch=16 --set layout.dp=1 --set layout.tp=1 --set layout.pp=4)
cli_case(plan_mlp_bad_tp 2 "/layout/tp = 8: the MLP model is planned without tensor parallelism" plan
         --set model.preset=custom --set model.style=mlp --set "model.widths=[784,128,10]")
cli_case(plan_mlp_bad_heads 2 "/model/heads: expected 0 for /model/style = mlp" plan --set model.preset=custom
         --set model.style=mlp --set "model.widths=[784,128,10]" --set model.heads=4)
