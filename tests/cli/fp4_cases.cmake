# `mpt fp4` (issue 18): the ablation grid on a tiny config, and its bad input (exit 2 before any work,
# naming the JSON pointer; run_case.sh checks that nothing is written).
set(FP4_TINY fp4 --set train.steps=6 --set data.train_samples=1024 --set data.test_samples=200 --set "model.hidden=[64,64]"
             --set ledger.step=2)
cli_case(fp4_tiny 0 "nvfp4_no_rht" ${FP4_TINY})
cli_case(fp4_list 0 "fp4 +4-bit training" list)
add_test(NAME cli.fp4_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> ${FP4_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# fp32 is the reference of the cost table's "vs fp32" (as fp8's /recipes): without it that column was nan
cli_case(fp4_no_fp32 2 "/variants: expected a list containing \"fp32\" .*got \\[\"bf16\",\"nvfp4\"\\]"
         ${FP4_TINY} --set "variants=[\"bf16\",\"nvfp4\"]")
cli_case(fp4_unknown_variant 2 "/variants/0: expected one of .*got \"nvfp4_no_hrt\" \\(did you mean \"nvfp4_no_rht\"\\?\\)"
         ${FP4_TINY} --set "variants=[\"nvfp4_no_hrt\"]")
cli_case(fp4_no_4bit_layer 2 "/model/hidden: expected at least two hidden layers" fp4 --set "model.hidden=[64]")
# A block that does not divide a dimension names the width (its index in /model/hidden) or the batch.
# 48: a multiple of 16 (NVFP4) but not of 32 (MXFP4); layer 2's input width is hidden[0].
cli_case(fp4_bad_hidden_mx 2 "/model/hidden/0: expected a multiple of 32 \\(variant mxfp4 on layer 2, 48 -> 48, batch 128: out operand A \\(x \\[128, 48\\]\\): block 1x32 does not divide it\\), got 48"
         ${FP4_TINY} --set "model.hidden=[48,48]")
# 40: no multiple of 16; layer 2's output width is hidden[1] (W [40, 64] in 16x16 blocks)
cli_case(fp4_bad_hidden_nv 2 "/model/hidden/1: expected a multiple of 16 \\(variant nvfp4 on layer 2, 64 -> 40, batch 128: out operand B \\(W \\[40, 64\\]\\): block 16x16 does not divide it\\), got 40"
         ${FP4_TINY} --set "model.hidden=[64,40]")
cli_case(fp4_bad_batch 2 "/train/batch: expected a multiple of 16 \\(variant nvfp4 on layer 2, 64 -> 64, batch 40: wgrad operand A \\(dy\\^T \\[64, 40\\]\\).*got 40"
         ${FP4_TINY} --set train.batch=40)
cli_case(fp4_bad_batch_mx 2 "/train/batch: expected a multiple of 32 \\(variant mxfp4 on layer 2, 64 -> 64, batch 48: wgrad operand A \\(dy\\^T \\[64, 48\\]\\).*got 48"
         ${FP4_TINY} --set train.batch=48)
# Fewer samples than a batch: a step takes them all (100, no multiple of 16). Was exit 3 from the RHT after the run began.
cli_case(fp4_few_samples 2 "/data/train_samples: expected at least /train/batch = 128 or a multiple of 16 .*got 100"
         ${FP4_TINY} --set data.train_samples=100)
cli_case(fp4_bad_ledger_step 2 "/ledger/step: expected a step below /train/steps = 6, got 6" ${FP4_TINY} --set ledger.step=6)

# Probe defects. 1: a config far too large is refused before allocating (exit 2 naming its keys):
# 784-8192-8192-10 is 74 M parameters, x 6 fp32 copies = 1.8 GB, against a 1 GB cap.
cli_case_env(fp4_memory MPT_MEMORY_LIMIT_BYTES=1000000000 2
             "/model/hidden, /train/batch, /data/test_samples: this config needs about [0-9.]+ GiB of memory \\(MLP under a variant: parameters x6"
             fp4 --set "model.hidden=[8192,8192]")
# ... and --print-config makes the same check (4).
cli_case_env(fp4_print_config_memory MPT_MEMORY_LIMIT_BYTES=1000000000 2 "/model/hidden, /train/batch, /data/test_samples: this config needs about"
             fp4 --set "model.hidden=[8192,8192]" --print-config)
# 3: at lr 100 the losses grow to nan (fp32's at step 4): the note and results.diverged say so.
diverged_case(fp4_diverged 0 "diverged: fp32's loss became nan at step 4" ${FP4_TINY} --set train.lr=100
              --set "variants=[\"fp32\",\"nvfp4\"]")

# Issue 18: the ablation grid on the tiny GPT (gpt.enabled), a tiny variant: 4 steps of 4 x 16 tokens at
# width 32 (64 tokens: the 1x32 and 16x16 blocks divide every operand).
set(FP4_GPT_TINY ${FP4_TINY} --set gpt.enabled=true --set gpt.steps=4 --set gpt.model.width=32 --set gpt.model.context=16
                 --set gpt.batch=4 --set gpt.eval_batches=1 --set gpt.ledger_step=2 --set gpt.log_every=2)
result_case(fp4_gpt_tiny fp4_gpt_rows ${FP4_GPT_TINY})
cli_case(fp4_gpt_table 0 "4-bit ablation grid on the tiny GPT 2x32" ${FP4_GPT_TINY})
# 48 is a multiple of 16 but not of 32 (MXFP4's 1x32 along the width; h0.c_attn is a bf16 layer of the recipe)
cli_case(fp4_gpt_bad_width 2 "/gpt/model/width: expected a multiple of 32 \\(variant mxfp4 on the GPT's h0.attn_proj, 48 -> 48"
         ${FP4_GPT_TINY} --set gpt.model.width=48 --set gpt.model.heads=4)
# 4 x 12 = 48 tokens: wgrad reduces over them, in 1x32 (MXFP4) blocks
cli_case(fp4_gpt_bad_batch 2 "/gpt/batch: expected /gpt/batch x /gpt/model/context \\(the tokens a step.*a multiple of 32 \\(variant mxfp4 on the GPT's h0.attn_proj, 32 -> 32.*got 4 x 12 = 48"
         ${FP4_GPT_TINY} --set gpt.model.context=12)
cli_case(fp4_gpt_bad_ledger 2 "/gpt/ledger_step: expected a step below /gpt/steps = 4, got 4" ${FP4_GPT_TINY} --set gpt.ledger_step=4)
# Measured memory (core/numerics/quant's measured_stored_bytes): measured == computed in every row of the MLP's and
# the GPT's memory tables, where this LibTorch has the dtypes (tests/cli/result_checks.py).
result_case(quant_memory_measured quant_memory_measured ${FP4_GPT_TINY})
