# CLI cases of `mpt fp8` (issue 18). A tiny config: every recipe, two fp8-sized hidden layers of 128
# (the blockwise tiles and MX blocks divide them and the batch), 8 steps: about a second.
set(FP8_TINY fp8 --set train.steps=8 --set data.train_samples=1024 --set data.test_samples=200
             --set "model.hidden=[128,128]" --set ledger.step=3 --set outlier.step=3 --set delayed.amax_history_len=3
             --set outlier.after=1 --set accumulator.k=1024)

cli_case(fp8_tiny 0 "OK: 2 of 2 checks passed" ${FP8_TINY})
cli_case(fp8_list 0 "fp8 +fp8 training recipes" list)
cli_case(fp8_tiny_e4m3_all 0 "OK: 2 of 2 checks passed" ${FP8_TINY} --set format=e4m3 --set model.fp8_layers=all
         --set "recipes=[\"fp32\",\"tensorwise\",\"delayed\",\"rowwise\"]")
add_test(NAME cli.fp8_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${FP8_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# The lesson's claims on the result: delayed scaling saturates at the outlier step and current does not;
# its scale stays small exactly while the history holds the outlier; FLOOR clips blocks, RCEIL none.
add_test(NAME cli.fp8_lessons
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/fp8_checks.sh $<TARGET_FILE:mpt> ${FP8_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.fp8_lessons PROPERTIES TIMEOUT 300)
# The GEMM error statistics at the top of /outlier/factor's range (1e30): finite, and current
# scaling's error at the outlier as at 1e3 (fp32 norms overflowed: 0.0 at 1e18, nan at 1e20).
add_test(NAME cli.fp8_huge_outlier
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/fp8_huge_outlier.sh $<TARGET_FILE:mpt> ${FP8_TINY}
                 --set "recipes=[\"fp32\",\"tensorwise\"]"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

# Bad input: exit 2 naming the key, nothing written (run_case.sh checks the result file).
cli_case(fp8_bad_tile 2 "/blockwise/tile: recipe blockwise on layer 2 .*block 1x96 does not divide" ${FP8_TINY}
         --set blockwise.tile=96)
cli_case(fp8_bad_weight_block 2 "/blockwise/weight_block: recipe blockwise on layer 2 .*block 96x96 does not divide" ${FP8_TINY}
         --set blockwise.weight_block=96)
cli_case(fp8_bad_mx_block 2 "/mx/block: recipe mxfp8 on layer 2 .*block 1x48 does not divide" ${FP8_TINY} --set mx.block=48)
cli_case(fp8_bad_all_layers 2 "/blockwise/tile: recipe blockwise on layer 1 \\(784 -> 128.*block 1x128 does not divide" ${FP8_TINY}
         --set model.fp8_layers=all)
cli_case(fp8_unknown_recipe 2 "/recipes/1: expected one of .*got \"tensorwize\" \\(did you mean \"tensorwise\"\\?\\)" ${FP8_TINY}
         --set "recipes=[\"fp32\",\"tensorwize\"]")
cli_case(fp8_history_zero 2 "/delayed/amax_history_len: expected an integer >= 1" ${FP8_TINY} --set delayed.amax_history_len=0)
cli_case(fp8_no_fp32 2 "/recipes: expected a list containing \"fp32\"" ${FP8_TINY} --set "recipes=[\"bf16\",\"tensorwise\"]")
cli_case(fp8_bad_ledger_step 2 "/ledger/step: expected a step below /train/steps = 8, got 8" ${FP8_TINY} --set ledger.step=8)
cli_case(fp8_unknown_algo 2 "/delayed/amax_compute_algo: expected one of \"max\", \"most_recent\", got \"mostrecent\" \\(did you mean \"most_recent\"\\?\\)"
         ${FP8_TINY} --set delayed.amax_compute_algo=mostrecent)
cli_case(fp8_missing_data 2 "/data/dir: expected a folder with Fashion-MNIST.*/nonexistent/fashion" ${FP8_TINY} --set data.dir=/nonexistent/fashion)

# one hidden layer with fp8_layers = inner: no layer would be fp8 (every recipe silently bf16)
cli_case(fp8_no_fp8_layer 2 "/model/fp8_layers: .inner. keeps the first and last Linear in bf16, which with /model/hidden = \\[100\\] leaves no layer in fp8"
         fp8 --set "model.hidden=[100]")
# --- fp8 on the tiny GPT (section 3, /gpt/enabled): 1 block of width 32 (2 heads), T = 16, 4 sequences
# (64 tokens per step), 32-wide blockwise tiles and weight blocks so every block divides C = 32, 3C, 4C
# and the 64 tokens; 6 steps per recipe: a few seconds.
set(FP8_GPT_TINY ${FP8_TINY} --set gpt.enabled=true --set gpt.model.layers=1 --set gpt.model.width=32 --set gpt.model.heads=2
                 --set gpt.model.context=16 --set gpt.batch=4 --set gpt.steps=6 --set gpt.ledger_step=2 --set gpt.mean_of_last=3
                 --set gpt.eval_batches=1 --set gpt.log_every=2 --set blockwise.tile=32 --set blockwise.weight_block=32)
cli_case(fp8_gpt_tiny 0 "mxfp8_floor / h0.mlp_proj / wgrad" ${FP8_GPT_TINY})
add_test(NAME cli.fp8_gpt_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${FP8_GPT_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.fp8_gpt_lessons
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/fp8_gpt_checks.sh $<TARGET_FILE:mpt> ${FP8_GPT_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# Bad input: a block that does not divide a GPT dimension or the tokens per step, heads not dividing the width.
cli_case(fp8_gpt_bad_tile 2 "/blockwise/tile: recipe blockwise on the GPT's h0.c_attn \\(48 -> 144, .*block 1x32 does not divide"
         ${FP8_GPT_TINY} --set gpt.model.width=48)
cli_case(fp8_gpt_bad_weight_block 2 "/blockwise/weight_block: recipe blockwise on the GPT's h0.c_attn \\(48 -> 144.*block 32x32 does not divide"
         ${FP8_GPT_TINY} --set gpt.model.width=48 --set blockwise.tile=16)
cli_case(fp8_gpt_bad_mx_block 2 "/mx/block: recipe mxfp8 on the GPT's h0.c_attn \\(48 -> 144.*block 1x32 does not divide"
         ${FP8_GPT_TINY} --set gpt.model.width=48 --set "recipes=[\"fp32\",\"mxfp8\"]")
cli_case(fp8_gpt_bad_tokens 2 "/blockwise/tile: recipe blockwise on the GPT's h0.c_attn \\(32 -> 96, /gpt/batch x /gpt/model/context = 48 tokens\\)"
         ${FP8_GPT_TINY} --set gpt.batch=3)
cli_case(fp8_gpt_bad_heads 2 "/gpt/model/heads: expected a divisor of /gpt/model/width \\(32\\), got 3" ${FP8_GPT_TINY}
         --set gpt.model.heads=3)
cli_case(fp8_gpt_bad_ledger_step 2 "/gpt/ledger_step: expected a step below /gpt/steps = 6, got 6" ${FP8_GPT_TINY}
         --set gpt.ledger_step=6)
cli_case(fp8_gpt_missing_text 3 "fortunes" ${FP8_GPT_TINY} --set gpt.text_dir=/nonexistent/fortunes)
# Fewer training samples than a batch: a step takes them all, which a block must divide: exit 2 naming the key (was exit 3 mid-run).
cli_case(fp8_few_samples 2 "/data/train_samples: expected at least /train/batch = 128 .*got 100" fp8 --set data.train_samples=100)

# Probe defects (bad input and divergence). 1: a config far too large is refused before allocating
# (exit 2 naming the keys of the largest term), here against a 1 GB cap: the MLP 784-8192-8192-10
# holds 74 M parameters, x 6 fp32 copies = 1.8 GB; the GPT of width 2048, 8 layers, 64 x 1024
# tokens keeps ~300 GiB of activations (Korthikanti et al.'s count, fp32, with quantized copies).
cli_case_env(fp8_memory_mlp MPT_MEMORY_LIMIT_BYTES=1000000000 2
             "/model/hidden, /train/batch, /data/test_samples: this config needs about [0-9.]+ GiB of memory \\(MLP under a recipe: parameters x6"
             fp8 --set "model.hidden=[8192,8192]")
cli_case_env(fp8_memory_gpt MPT_MEMORY_LIMIT_BYTES=8589934592 2
             "/gpt/batch, /gpt/model/context, /gpt/model/width, /gpt/model/heads, /gpt/model/layers: this config needs about [0-9]+ GiB"
             ${FP8_GPT_TINY} --set gpt.model.width=2048 --set gpt.model.heads=16 --set gpt.model.layers=8
             --set gpt.model.context=1024 --set gpt.batch=64)
cli_case_env(fp8_memory_accumulator MPT_MEMORY_LIMIT_BYTES=1000000000 2 "/accumulator/k, /accumulator/m, /accumulator/n: this config needs about"
             ${FP8_TINY} --set accumulator.k=1048576 --set accumulator.m=4096)
# 4: --print-config runs validate: a ledger step beyond the run is refused there too.
cli_case(fp8_print_config_validates 2 "/ledger/step: expected a step below /train/steps = 8, got 8" ${FP8_TINY}
         --set ledger.step=8 --print-config)
# 5: a directory or an empty file in the GPT's text file list: exit 2 naming the entry (was exit 3 "read error").
cli_case(fp8_gpt_text_directory 2 "/gpt/text_files/1: expected a text file .*got \"text\": tests/cli/text is a directory"
         ${FP8_GPT_TINY} --set gpt.text_dir=tests/cli --set "gpt.text_files=[\"text/four_chars\",\"text\"]")
cli_case(fp8_gpt_text_empty 2 "/gpt/text_files/0: expected a text file .*got \"empty\": tests/cli/text/empty is empty"
         ${FP8_GPT_TINY} --set gpt.text_dir=tests/cli/text --set "gpt.text_files=[\"empty\",\"four_chars\"]")
# 3: divergence is said: at lr 100 every recipe's loss grows to nan (fp32's at step 4); the note names
# the run and the step, results.diverged lists it. No equivalence check compares the recipes: exit 0.
diverged_case(fp8_diverged 0 "diverged: fp32's loss became nan at step 4" ${FP8_TINY} --set train.lr=100
              --set "recipes=[\"fp32\",\"tensorwise\"]" --set outlier.enabled=false)
# Probe leftovers: a corpus too short to split, and a context longer than the validation split,
# exit 2 in validate naming the keys (were exit 3 at run time naming the folder, and
# --print-config passed them).
cli_case(fp8_gpt_text_too_short 2 "/gpt/text_files: expected a corpus long enough to split into training and validation text .*got 3 characters"
         ${FP8_GPT_TINY} --set gpt.text_dir=tests/cli/text --set "gpt.text_files=[\"tiny\"]")
cli_case(fp8_gpt_context_beyond_validation_text 2 "/gpt/model/context: expected fewer tokens than the validation split of /gpt/text_files \\(14 of 135 characters.*got 16"
         ${FP8_GPT_TINY} --set gpt.text_dir=tests/cli/text --set "gpt.text_files=[\"four_chars\"]")
# Probe (stop 27): at lr 100 the training losses may stay finite while the test loss is nan or inf: the run
# is said to have diverged, and every gap to a diverged bf16 run is nan (were finite numbers).
cli_case(fp8_test_loss_diverged 0 "fp32 +(nan|inf) +[0-9.]+ +nan +nan "
         fp8 --set train.steps=4 --set data.train_samples=1024 --set data.test_samples=200 --set "model.hidden=[32,32]"
         --set ledger.step=3 --set outlier.step=3 --set delayed.amax_history_len=3 --set outlier.after=1
         --set accumulator.k=1024 --set "recipes=[\"fp32\",\"bf16\",\"tensorwise\"]" --set train.lr=100)
# Measured memory of every fp8 recipe (E4M3, E5M2, fp32 / E8M0 scales, bf16 edges): measured == computed.
result_case(quant_memory_measured_fp8 quant_memory_measured ${FP8_TINY})
