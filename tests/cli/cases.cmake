# CLI cases through ctest (see cli_case in tests/CMakeLists.txt).
set(B tests/cli/bad)

# diverged_case(NAME EXIT_CODE REGEX ARGS...): a run whose loss becomes nan or inf (a huge learning
# rate): the note (REGEX) and results.diverged are there, and the exit code is the run's own (1 where
# an equivalence check compares the diverged run: nan is a mismatch). See tests/cli/diverged_case.sh.
function(diverged_case name code regex)
  add_test(NAME cli.${name}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/diverged_case.sh $<TARGET_FILE:mpt> ${code} ${regex} ${ARGN}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.${name} PROPERTIES TIMEOUT 300)
endfunction()

# --- the command line itself ---
cli_case(help 0 "underflow" --help)
cli_case(version 0 "^mpt [0-9]+\\.[0-9]+\\.[0-9]+" --version)
cli_case(list 0 "underflow +What fp16" list)
cli_case(did_you_mean 2 "unknown experiment 'undeflow' \\(did you mean 'underflow'\\?\\)" undeflow)
cli_case(subcommand_help 0 "model\\.depth" underflow --help)
cli_case(unknown_option 2 "^\\[error\\] mpt underflow: usage error: The following argument was not expected: --bogus. see `mpt underflow --help`" underflow --bogus)
cli_case(quiet_and_verbose 2 "usage error: --quiet excludes --verbose" underflow -q -v)
# CLI11's parse errors in mpt's error form (probe, stop 31: they were CLI11's bare text).
cli_case(no_subcommand 2 "^\\[error\\] mpt: usage error: expected an experiment or a command \\(`mpt list` shows them\\)")
cli_case(compare_bad_rtol 2 "^\\[error\\] mpt compare: usage error: .*--rtol.*abc" compare a.json b.json --rtol abc)

# --- underflow runs ---
cli_case(underflow_default 0 "OK: [0-9]+ of [0-9]+ checks passed" underflow)
cli_case(underflow_depth_sweep 0 "d16\\.L17" underflow --config configs/underflow_depth_sweep.json)
cli_case(underflow_set 0 "d4\\.L05" underflow --set model.depth=4 --set data.batch=8)
cli_case(underflow_set_list 0 "d3\\.L04.*" underflow --set "model.depth=[2,3]")
cli_case(underflow_quiet 0 ANY underflow -q)
# An update that rounds to 0 in fp16 (probe, issue 38): lost at every step, not "0 lost".
cli_case(underflow_update_rounds_to_zero 0 "^ +fp16 +1 +1 +5 " underflow --set updates.count=5 --set updates.step=1e-30)
# Non-finite cast values as result files write them (issue 38): each format's stored value and class.
cli_case(underflow_cast_non_finite 0 "^ +-inf +-inf +-inf +- +inf$" underflow
         --set "cast.values=[\"nan\",\"inf\",\"-inf\",1e-3]" --set "cast.formats=[\"fp16\"]")
cli_case(underflow_cast_bad_string 2 "/cast/values/1: expected a number .*or one of \"nan\", \"inf\", \"-inf\", got a string \"NaN\""
         underflow --set "cast.values=[1e-3,\"NaN\"]")
cli_case(print_config 0 "\"depth\": 7" underflow --print-config --set model.depth=7)
# --print-config runs the checks a run makes before its work: a config validate refuses is not printed.
cli_case(print_config_validates 2 "/histogram/max_log2: expected a value greater than /histogram/min_log2 \\(-10\\), got -20"
         underflow --print-config --set histogram.min_log2=-10 --set histogram.max_log2=-20)
# (its memory estimate too: cli.print_config_memory in fault_cases.cmake)
# --print-config output is a config file that reproduces the run.
add_test(NAME cli.print_config_roundtrip
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/print_config_roundtrip.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# Same config twice => identical `results` (and checks).
add_test(NAME cli.deterministic_results
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> underflow
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- bad configs: exit 2, message names file/pointer/expectation, nothing written ---
cli_case(bad_missing_file 2 "no/such/file.json: cannot open" underflow --config no/such/file.json)
cli_case(bad_truncated 2 "truncated.json: invalid JSON: .*line 1" underflow --config ${B}/truncated.json)
cli_case(bad_unknown_key 2 "unknown_key.json: /model/dept: unknown key \"dept\" \\(did you mean \"depth\"\\?\\)" underflow --config ${B}/unknown_key.json)
cli_case(bad_wrong_type 2 "wrong_type.json: /model/depth: expected an integer .*got a string \"deep\"" underflow --config ${B}/wrong_type.json)
cli_case(bad_out_of_range 2 "out_of_range.json: /model/depth: expected .*>= 1.*got 0" underflow --config ${B}/out_of_range.json)
cli_case(bad_not_object 2 "not_object.json: /: expected a JSON object" underflow --config ${B}/not_object.json)
cli_case(bad_choice 2 "bad_choice.json: /cast/formats/1: expected one of .*got \"fp61\" \\(did you mean \"fp16\"\\?\\)" underflow --config ${B}/bad_choice.json)
cli_case(bad_object_expected 2 "object_expected.json: /model: expected an object" underflow --config ${B}/object_expected.json)
cli_case(bad_inverted_range 2 "/histogram/max_log2: expected a value greater than" underflow --config ${B}/inverted_range.json)
cli_case(bad_set_syntax 2 "--set 'model.depth': expected KEY=VALUE" underflow --set model.depth)
cli_case(bad_set_unknown 2 "--set 'model.widht=8': /model/widht: unknown key \"widht\" \\(did you mean \"width\"\\?\\)" underflow --set model.widht=8)
cli_case(bad_set_type 2 "/data/batch: expected an integer" underflow --set data.batch=1.5)
cli_case(bad_set_empty_list 2 "/model/depth: expected .*non-empty" underflow --set "model.depth=[]")
cli_case(bad_device 2 "device" underflow --device tpu)
cli_case(bad_seed 2 "/seed: expected an integer >= 0" underflow --seed -1)
cli_case(bad_seed_huge 2 "--seed '99999999999999999999': /seed: expected an integer >= 0, got a number 1e\\+20" underflow
         --seed 99999999999999999999)
cli_case(bad_duplicate_key 2 "duplicate_key.json: /model/depth: duplicate key" underflow --config ${B}/duplicate_key.json)
cli_case(bad_set_duplicate_key 2 "/model/width: duplicate key" underflow
         --set "model={\"width\": 8, \"width\": 9}")
cli_case(bad_out_directory 2 "--out tests: is a directory" underflow --set model.depth=2 --out tests)
cli_case(bad_out_parent_file 2 "--out README.md/x.json: cannot create directory README.md" underflow --set model.depth=2
         --out README.md/x.json)
cli_case(bad_config_directory 2 "configs: is a directory, not a config file" underflow --config configs)
# --nproc on a one-process experiment: a usage error that names the experiments taking it (it was
# CLI11's "The following arguments were not expected: 2 --nproc"; probe, stop 30).
cli_case(bad_nproc_single_process 2 "--nproc '2': underflow runs in one process. --nproc is for the multi-process experiments \\(.*dataparallel.*shard"
         underflow --nproc 2)
cli_case(bad_set_null 2 "/model/depth: expected an integer \\(or a list of them\\) .*, got null$" underflow --set model.depth=null)
if(NOT MPT_WITH_CUDA)  # a CUDA build may have a device: then --device cuda runs
  cli_case(no_cuda 3 "CUDA" underflow --device cuda)
endif()
cli_case(bad_set_pointer 2 "not a valid key path" underflow --set "model.dep~th=3")
add_test(NAME cli.configs_match_defaults
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/configs_match_defaults.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- mpt compare ---
add_test(NAME cli.compare
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/compare_cases.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- scripts/sweep.py: a 2x2 grid writes 4 result files and a summary CSV with the fields ---
add_test(NAME cli.sweep
         COMMAND bash -c "set -e; d=$(mktemp -d); /usr/bin/python3 scripts/sweep.py underflow --mpt $<TARGET_FILE:mpt> --grid model.depth=2,3 --grid seed=0,1 --set data.batch=4 --field '/results/gradients/d{model.depth}.L01/underflow_fp16' --field /results/formats/fp16/max --out-dir $d; test $(ls $d/*.json | wc -l) = 4; /usr/bin/python3 -c \"import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); assert len(r)==4, r; assert all(x['exit_code']=='0' for x in r); assert all(x['/results/formats/fp16/max']=='65504.0' for x in r); assert all(x['/results/gradients/d{model.depth}.L01/underflow_fp16'] != '' for x in r); print('ok', r[0])\" $d/summary.csv; rm -rf $d"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- scripts/plot.py renders every plot of the golden results (headless) as real images ---
add_test(NAME cli.plots
         COMMAND bash -c "set -e; if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then echo 'SKIPPED: python3-matplotlib missing'; exit 77; fi; d=$(mktemp -d); /usr/bin/python3 scripts/plot.py $(ls tests/golden/*.json | grep -v config.json) --out-dir $d > $d/list; test -s $d/list; for f in $(cat $d/list); do test -s $f; head -c 8 $f | od -An -c | grep -q 'P   N   G' || { echo \"not a PNG: $f\"; exit 1; }; done; echo ok: $(wc -l < $d/list) plots; rm -rf $d"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.plots PROPERTIES SKIP_RETURN_CODE 77)
# An output folder that cannot be written: exit 2 and one line naming it, not a traceback.
add_test(NAME cli.scripts_unwritable_out_dir
         COMMAND bash -c "for s in 'sweep.py underflow --mpt $<TARGET_FILE:mpt>' 'plot.py tests/golden/underflow.json'; do out=\$(/usr/bin/python3 scripts/\$s --out-dir /proc/mpt-nowhere 2>&1); rc=\$?; echo \"\$out\"; test \$rc = 2 || exit 1; echo \"\$out\" | grep -q 'out-dir /proc/mpt-nowhere: cannot write there' || exit 1; ! echo \"\$out\" | grep -q Traceback || exit 1; done; echo ok"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# Hostile input for the scripts (issue 15, defect 10): names from values sanitised inside --out-dir,
# a repeated --grid key, list values, a missing --mpt, Ctrl-C, unknown --fields (a fake mpt, and the
# real one for one end-to-end case); plot.py: bad files one line each, no plot overwritten.
# Issue 38: a grid over --max-points, mpt's commands (compare, env) as the experiment, an --out-dir
# that is a file; a 60 MiB trace plotted in 3 GiB of address space, with as many artists as a small one.
add_test(NAME cli.sweep_hostile
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/scripts_cases.py sweep $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.plot_hostile
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/scripts_cases.py plot
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.plot_hostile PROPERTIES SKIP_RETURN_CODE 77)
# plot.py under a Python without matplotlib (python3 -S): one line naming the module and the fix,
# exit 3 (issue 38); runs with or without python3-matplotlib installed.
add_test(NAME cli.plot_without_matplotlib
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/scripts_cases.py plotdeps
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.gpu_check_args
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/scripts_cases.py gpucheck
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- found by trying mpt as a new user ---
add_test(NAME cli.bad_out_empty
         COMMAND bash -c "out=\$($<TARGET_FILE:mpt> underflow --set model.depth=2 --out '' 2>&1); test \$? = 2 && echo \"\$out\" | grep -q -- '--out: expected a file path' && echo ok"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
cli_case(bad_set_empty_segment 2 "empty key segment" underflow --set model..depth=4)
cli_case(bad_set_huge_number 2 "/seed: expected a number within double.s range \\(magnitude at most 1.8e308\\), got 1e400" underflow --set seed=1e400)
add_test(NAME cli.out_dev_null
         COMMAND bash -c "$<TARGET_FILE:mpt> underflow -q --set model.depth=2 --out /dev/null && test -c /dev/null && echo ok: /dev/null is still a device"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# --- hostile input (issue 15: defects 3, 4, 11): endless, deep, huge and escaping input ---
foreach(c config_dev_zero config_dev_urandom config_deep set_deep config_long_list config_long_key set_ansi_key
          config_nul_key exact_limits compare_dev_zero compare_deep compare_results_not_object compare_missing_leaf
          compare_big_integers compare_timing_zero compare_ansi)
  add_test(NAME cli.hostile.${c} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/hostile_input.sh $<TARGET_FILE:mpt> ${c}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(cli.hostile.${c} PROPERTIES TIMEOUT 120)
endforeach()

# --- from the second new-user probe (issue 15) ---
cli_case(bad_config_nul 2 "nul.json: invalid JSON: a NUL byte at offset 10" underflow --config ${B}/nul.json)
cli_case(bad_seed_named 2 "--seed '-5': /seed: expected an integer >= 0" underflow --seed -5)
add_test(NAME cli.probe2_compare_and_config COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/probe2_cases.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
cli_case(dataparallel_no_runnable_n 2 "/train/nprocs: expected at least one N <= the 2 process\\(es\\)" dataparallel
         --config configs/dataparallel_quick.json --nproc 2 --set "train.nprocs=[4]")
cli_case(dataparallel_too_few_samples 2 "/train/samples: expected at least /train/global_batch = 64 samples" dataparallel
         --config configs/dataparallel_quick.json --set train.samples=10 --set train.global_batch=64)
cli_case(dataparallel_fault_rank_missing 2 "/fault/rank: expected -1 or a rank 0 .. 1, got 5" dataparallel
         --config configs/dataparallel_quick.json --nproc 2 --set fault.rank=5)
cli_case_env(dataparallel_env_rank_only "RANK=0;MASTER_ADDR=127.0.0.1;MASTER_PORT=29999" 2
             "RANK is set but WORLD_SIZE is not" dataparallel --config configs/dataparallel_quick.json)
# Probe (issue 38): a world size past the cap read "not a non-negative integer"; MPT_RANK set by hand
# (mpt --nproc sets it with MPT_WORLD_SIZE for its workers) was reported without naming it.
cli_case_env(dataparallel_env_world_size_too_large "RANK=0;WORLD_SIZE=99999999999;MASTER_ADDR=127.0.0.1;MASTER_PORT=29999" 2
             "environment variable WORLD_SIZE=99999999999 is too large: at most 1000000 processes" dataparallel
             --config configs/dataparallel_quick.json)
cli_case_env(dataparallel_env_mpt_rank_by_hand "MPT_RANK=1" 2
             "MPT_RANK=1 is set but MPT_WORLD_SIZE is not.? mpt --nproc sets both" dataparallel
             --config configs/dataparallel_quick.json)
cli_case_env(dataparallel_env_mpt_world_size_by_hand "MPT_WORLD_SIZE=2" 2
             "MPT_WORLD_SIZE=2 is set but MPT_RANK is not.? mpt --nproc sets them" dataparallel
             --config configs/dataparallel_quick.json)
cli_case_env(shard_env_mpt_vars_by_hand "MPT_RANK=0;MPT_WORLD_SIZE=2" 2
             "MASTER_PORT must be set .*got none \\(MPT_RANK and MPT_WORLD_SIZE are set: mpt --nproc sets them" shard
             --config configs/shard_quick.json --nproc 2)
cli_case_env(dataparallel_env_mpt_rank_past_world "MPT_RANK=1;MPT_WORLD_SIZE=1" 2
             "mpt environment: MPT_RANK=1 is not a rank in \\[0, MPT_WORLD_SIZE=1\\)" dataparallel
             --config configs/dataparallel_quick.json)
# Probe (stop 30): the message did not echo the port it refused.
cli_case_env(dataparallel_env_port_out_of_range "RANK=1;WORLD_SIZE=2;MASTER_ADDR=127.0.0.1;MASTER_PORT=99999" 2
             "MASTER_PORT must be set to a TCP port \\(1-65535\\) for 2 processes, got \"99999\"" dataparallel
             --config configs/dataparallel_quick.json)
# A launcher's per-node variables that describe no place (found by the stop-27 probe: accepted).
cli_case_env(shard_env_local_rank_out_of_node
             "RANK=1;WORLD_SIZE=2;LOCAL_RANK=2;LOCAL_WORLD_SIZE=2;MASTER_ADDR=127.0.0.1;MASTER_PORT=29999" 2
             "torchrun environment: LOCAL_RANK=2 is not a local rank in \\[0, LOCAL_WORLD_SIZE=2\\)"
             shard --config configs/shard_quick.json)
# torchrun's node counts that cannot fit the world (found by the stop-28 probe: accepted).
cli_case_env(shard_env_nodes_exceed_world
             "RANK=1;WORLD_SIZE=2;LOCAL_RANK=1;LOCAL_WORLD_SIZE=2;GROUP_RANK=0;GROUP_WORLD_SIZE=2;MASTER_ADDR=127.0.0.1;MASTER_PORT=29999" 2
             "torchrun environment: LOCAL_WORLD_SIZE=2 processes on this node and GROUP_WORLD_SIZE=2 nodes need at least 3 processes, more than WORLD_SIZE=2"
             shard --config configs/shard_quick.json)
cli_case_env(shard_env_group_rank_past_rank
             "RANK=1;WORLD_SIZE=4;LOCAL_RANK=0;LOCAL_WORLD_SIZE=1;GROUP_RANK=2;GROUP_WORLD_SIZE=4;MASTER_ADDR=127.0.0.1;MASTER_PORT=29999" 2
             "torchrun environment: GROUP_RANK=2 needs at least 2 ranks on the nodes before this one, but this node.s first rank is RANK - LOCAL_RANK = 1"
             shard --config configs/shard_quick.json)

# A MASTER_ADDR that does not resolve: named at once (it was a page of c10d retries and two
# timeouts). RES_OPTIONS bounds the lookup where no DNS server answers (as in a sandbox).
cli_case_env(shard_env_master_addr_unresolvable
             "RANK=1;WORLD_SIZE=2;MASTER_ADDR=no-such-host.invalid;MASTER_PORT=29999;RES_OPTIONS=timeout:1 attempts:1" 2
             "torchrun environment: MASTER_ADDR=\"no-such-host.invalid\" does not resolve to an address"
             shard --config configs/shard_quick.json)
add_test(NAME cli.scripts_full_disk COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/scripts_full_disk.sh
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# --nproc goes through the schema as --set nproc=N: a fraction is named like any other value
# (it was CLI11's "could not be converted"; found by the stop-28 probe).
cli_case(dataparallel_nproc_fraction 2 "--nproc '2.5'.*/nproc: expected an integer" dataparallel --nproc 2.5)
# Started from a working folder that was deleted (issue 38): named, exit 3, before LibTorch loads.
add_test(NAME cli.deleted_working_folder COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deleted_working_folder.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# A world size that the config does not fit, given on the command line (issue 38): --nproc (or its
# --set) is named as the cause, not the config file; --nproc and a --set of nproc that disagree are refused.
cli_case(shard_nproc_does_not_fit 2
         "--nproc 3: configs/shard_quick.json does not fit 3 processes: /train/global_batch: expected a multiple of"
         shard --config configs/shard_quick.json --nproc 3)
cli_case(shard_set_nproc_does_not_fit 2
         "--set 'nproc=3': configs/shard_quick.json does not fit 3 processes: /train/global_batch"
         shard --config configs/shard_quick.json --set nproc=3)
cli_case(collectives_nproc_does_not_fit 2
         "--nproc 1: configs/collectives_quick.json does not fit 1 process: /ops/5: \"sendrecv\" needs at least 2 processes"
         collectives --config configs/collectives_quick.json --nproc 1)
cli_case(dataparallel_nproc_conflicts_with_set 2 "--nproc 2 and --set 'nproc=4' give /nproc two values: keep one"
         dataparallel --config configs/dataparallel_quick.json --nproc 2 --set nproc=4)
