# `mpt lossscale` CLI cases (tiny configs; see cli_case in tests/CMakeLists.txt).
set(LS_TINY --set train.train_samples=200 --set train.test_samples=100 --set train.steps=20 --set train.batch=20
    --set train.hidden.depth=2 --set train.hidden.width=16
    --set gpt.steps=3 --set gpt.model.width=16 --set gpt.model.context=8 --set gpt.batch=4 --set gpt.eval_batches=1)
set(LS_NO_GPT --set gpt.enabled=false)
cli_case(lossscale_tiny 0 "safe window" lossscale ${LS_TINY})
cli_case(lossscale_overflow 0 "safe window: EMPTY" lossscale --config configs/lossscale_overflow.json ${LS_NO_GPT})
cli_case(lossscale_sweep_only 0 "2\\^28" lossscale --set train.enabled=false ${LS_NO_GPT})
# With the GEMM ceilings timed, each narrow format gets a verdict (faster, about as fast, or why
# not: its kernels or the size), or a note saying why there is none. Which verdict is the machine's,
# so the first case accepts them all; the others have one answer. The first pins native compute:
# under compute=auto a CPU whose bf16 kernels are slower than emulating them (AVX2 only) runs bf16
# emulated, and there is no verdict to check.
cli_case(lossscale_ceiling_verdict 0 "# bf16: (faster than fp32 here|about as fast as fp32|not faster|no verdict: at N = 64)"
         lossscale ${LS_TINY} ${LS_NO_GPT} --set "train.recipes=[\"fp32\",\"bf16\"]" --set train.gemm_ceiling=64
         --set train.compute=native)
cli_case(lossscale_ceiling_no_fp32 0 "# bf16: no verdict: no fp32 recipe ran"
         lossscale ${LS_TINY} ${LS_NO_GPT} --set "train.recipes=[\"bf16+master\"]" --set train.gemm_ceiling=64)
cli_case(lossscale_ceiling_emulated 0 "# bf16: no verdict: no recipe ran bf16 natively"
         lossscale ${LS_TINY} ${LS_NO_GPT} --set "train.recipes=[\"fp32\",\"bf16\"]" --set train.gemm_ceiling=64
         --set train.compute=emulated)
cli_case(lossscale_ceiling_without_training 0 "/train/gemm_ceiling = 64 is not used"
         lossscale ${LS_NO_GPT} --set train.enabled=false --set train.gemm_ceiling=64)
# The growth rule reaches the scaler (issue 38): from S = 1 (no overflow) with window 4 over 20 steps,
# Megatron's rule grows after steps 4, 8, 12, 16, 20 (final scale 32), DeepSpeed's after steps 5, 9, 13, 17
# (its stable interval counts the steps before the current one: 16).
set(LS_RULE lossscale ${LS_TINY} ${LS_NO_GPT} --set "train.recipes=[\"fp16+master+dynamic\"]" --set train.scaler.init_scale=1
    --set train.scaler.growth_interval=4)
cli_case(lossscale_rule_megatron 0 "fp16\\+master\\+dynamic +[^ ]+ +[^ ]+ +0 +3.20e\\+01" ${LS_RULE})
cli_case(lossscale_rule_deepspeed 0 "fp16\\+master\\+dynamic +[^ ]+ +[^ ]+ +0 +1.60e\\+01" ${LS_RULE}
         --set train.scaler.rule=deepspeed)
cli_case(lossscale_consecutive_at_hysteresis_one 0 "consecutive_hysteresis = true changes nothing at /train/scaler/hysteresis = 1"
         lossscale ${LS_TINY} ${LS_NO_GPT} --set "train.recipes=[\"fp16+master+dynamic\"]" --set train.scaler.consecutive_hysteresis=true)
cli_case(lossscale_bad_growth_huge 2 "/train/scaler/growth_factor: expected a number > 1 and <= 3.40282.*, got 1e\\+39"
         lossscale --set train.scaler.growth_factor=1e39)
cli_case(lossscale_bad_rule 2 "/train/scaler/rule: expected one of \"megatron\", \"deepspeed\", got \"DeepSpeed\" \\(did you mean \"deepspeed\"\\?\\)"
         lossscale --set train.scaler.rule=DeepSpeed)
# bad inputs: exit 2 naming the key; missing data: exit 2 naming the key and the package
cli_case(lossscale_bad_negative_scale 2 "/sweep/scales/1: expected a number > 0, got -4" lossscale --set "sweep.scales=[1,-4]")
cli_case(lossscale_bad_static_scale 2 "/train/static_scale: expected a number > 0, got -1" lossscale --set train.static_scale=-1)
cli_case(lossscale_bad_init_scale 2 "/train/scaler/init_scale: expected a number > 0.*got 0" lossscale --set train.scaler.init_scale=0)
cli_case(lossscale_bad_growth 2 "/train/scaler/growth_factor: expected a number > 1 and <= 3.40282[0-9.e+]*, got 1" lossscale --set train.scaler.growth_factor=1)
cli_case(lossscale_bad_growth_below 2 "/train/scaler/growth_factor: expected a number > 1 and <= 3.40282[0-9.e+]*, got 0.5" lossscale --set train.scaler.growth_factor=0.5)
cli_case(lossscale_bad_backoff 2 "/train/scaler/backoff_factor: expected a number > 0 and < 1, got 1" lossscale --set train.scaler.backoff_factor=1)
cli_case(lossscale_bad_interval 2 "/train/scaler/growth_interval: expected an integer >= 1" lossscale --set train.scaler.growth_interval=0)
cli_case(lossscale_bad_min_scale 2 "/train/scaler/min_scale: expected a value <= /train/scaler/init_scale" lossscale ${LS_TINY} --set train.scaler.min_scale=1e9)
cli_case(lossscale_missing_data 2 "/train/data_dir: expected a folder with Fashion-MNIST.*dataset-fashion-mnist.*/no/such/dir" lossscale --set train.data_dir=/no/such/dir)
add_test(NAME cli.lossscale_train COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/lossscale_train.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_train PROPERTIES TIMEOUT 300)
# pure bf16 without master weights: stochastic rounding and Kahan summation of the update,
# with native bf16 kernels (auto, where the CPU has them) and emulated
add_test(NAME cli.lossscale_pure_bf16 COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/lossscale_pure_bf16.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
add_test(NAME cli.lossscale_pure_bf16_emulated
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/lossscale_pure_bf16.sh $<TARGET_FILE:mpt> --set train.compute=emulated
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_pure_bf16 cli.lossscale_pure_bf16_emulated PROPERTIES TIMEOUT 300)
add_test(NAME cli.lossscale_deterministic
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/deterministic.sh $<TARGET_FILE:mpt> lossscale ${LS_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
# compute modes (/train/compute, /sweep/compute) and the loss-in-low-precision switch
cli_case(lossscale_compute_emulated 0 "compute: bf16 emulated, fp16 emulated" lossscale ${LS_TINY} --set train.compute=emulated)
cli_case(lossscale_sweep_emulated 0 "S\\*loss in fp16 \\(emulated\\)" lossscale --set train.enabled=false --set sweep.compute=emulated ${LS_NO_GPT})
cli_case(lossscale_bad_compute 2 "/train/compute" lossscale --set train.compute=fast)
if(Torch_VERSION VERSION_LESS 2)
  # Debian's LibTorch 1.13 has no CPU fp16 matmul: asking for native fp16 is refused, naming why.
  cli_case(lossscale_native_fp16_refused 3 "native fp16 compute: LibTorch .* has no working fp16 matrix product on cpu"
           lossscale ${LS_TINY} --device cpu --set train.compute=native)
endif()
# Native bf16 recipes wherever bf16 GEMMs run (on AVX-512 BF16 / AMX CPUs through oneDNN, whose
# scratch memory comes from the counting allocator's raw interface: issue 14's crash), and the
# same under oneDNN's AVX2 cap, where auto must still finish (emulating if the kernels fail).
cli_case(lossscale_native_bf16 0 "bf16\\+master" lossscale ${LS_TINY} --device cpu --set train.compute=native
         --set "train.recipes=[\"bf16\",\"bf16+master\"]")
cli_case(lossscale_auto_bf16 0 "bf16\\+master" lossscale ${LS_TINY} --device cpu
         --set "train.recipes=[\"bf16\",\"bf16+master\"]")
add_test(NAME cli.lossscale_auto_bf16_isa_avx2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/run_case.sh $<TARGET_FILE:mpt> 0 "bf16\\+master" lossscale ${LS_TINY}
                 --device cpu --set "train.recipes=[\"bf16\",\"bf16+master\"]"
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_auto_bf16_isa_avx2 PROPERTIES ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DNNL_MAX_CPU_ISA=AVX2")
# Native bf16 under the same cap: refused with the reason where LibTorch 1.13 would abort inside
# oneDNN (an AVX-512 CPU), trained everywhere else (tests/cli/native_bf16_capped.sh decides which).
add_test(NAME cli.lossscale_native_bf16_isa_avx2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/native_bf16_capped.sh $<TARGET_FILE:mpt> ${LS_TINY}
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_native_bf16_isa_avx2 PROPERTIES ENVIRONMENT "ONEDNN_MAX_CPU_ISA=AVX2;DNNL_MAX_CPU_ISA=AVX2")
add_test(NAME cli.lossscale_loss_in_low_precision COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/lossscale_low_loss.sh $<TARGET_FILE:mpt>
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_loss_in_low_precision PROPERTIES TIMEOUT 300)
# section 3, the tiny GPT under per-operation precision policies
cli_case(lossscale_gpt_policies 0 "Per-operation precision: tiny GPT 2x16 \\(4 heads, T = 8" lossscale --set train.enabled=false ${LS_TINY}
         --set "gpt.policies=[\"fp32\",\"fp16+fp32_softmax\"]")
cli_case(lossscale_gpt_bad_site 2 "/gpt/policies/1: policy 'fp16\\+fp32_attention': expected modifiers \\+fp32_<site>" lossscale
         --set "gpt.policies=[\"fp32\",\"fp16+fp32_attention\"]")
cli_case(lossscale_gpt_bad_format 2 "/gpt/policies/0: policy 'fp8' must start with fp32, fp16 or bf16" lossscale --set "gpt.policies=[\"fp8\"]")
cli_case(lossscale_gpt_bad_heads 2 "/gpt/model/heads: expected a divisor of /gpt/model/width \\(64\\), got 3" lossscale --set gpt.model.heads=3)
cli_case(lossscale_gpt_no_text 3 "/no/such/dir/computers: cannot open.*fortunes" lossscale --set train.enabled=false --set gpt.text_dir=/no/such/dir)
cli_case(lossscale_duplicate_recipe 2 "/train/recipes/1: expected each value once, got \"fp32\" again \\(also /train/recipes/0\\)"
         lossscale --set "train.recipes=[\"fp32\",\"fp32\"]")

# Probe defects. 5: a directory or an empty file among /gpt/text_files: exit 2 naming the entry
# (was exit 3 "read error" for a directory, and an empty file was silently accepted).
cli_case(lossscale_gpt_text_directory 2 "/gpt/text_files/0: expected a text file .*tests/cli/text is a directory"
         lossscale ${LS_TINY} --set train.enabled=false --set gpt.text_dir=tests/cli --set "gpt.text_files=[\"text\"]")
cli_case(lossscale_gpt_text_empty 2 "/gpt/text_files/1: expected a text file .*tests/cli/text/empty is empty"
         lossscale ${LS_TINY} --set train.enabled=false --set gpt.text_dir=tests/cli/text
         --set "gpt.text_files=[\"four_chars\",\"empty\"]")
# 3: divergence is said. At lr 1e20 every recipe's loss is nan from step 2, the GPT's policies'
# too (both parts count steps from 1, as the curve; the GPT's counted from 0 until the stop-27
# probe found the two parts of one command disagree). No check compares the losses: exit 0.
diverged_case(lossscale_diverged 0 "diverged: fp32's loss became nan at step 2" lossscale ${LS_TINY} ${LS_NO_GPT}
              --set train.lr=1e20 --set "train.recipes=[\"fp32\",\"fp16+master+dynamic\"]")
diverged_case(lossscale_gpt_diverged 0 "diverged: fp32's loss became nan at step 2" lossscale ${LS_TINY}
              --set train.enabled=false --set gpt.lr=1e20 --set "gpt.policies=[\"fp32\",\"bf16\"]")
# Probe leftover: a corpus too short to split exits 2 in validate, so --print-config refuses it too.
cli_case(lossscale_gpt_text_too_short_print_config 2 "/gpt/text_files: expected a corpus long enough to split .*got 3 characters"
         lossscale ${LS_TINY} --print-config --set gpt.text_dir=tests/cli/text --set "gpt.text_files=[\"tiny\"]")
# Probe (stop 27): under -q (no tables, so no notes) divergence was not said at all; now a warning on stderr.
cli_case(lossscale_quiet_says_diverged 0 "mpt lossscale: diverged \\(a loss became nan or inf\\): fp32 \\(step [0-9]+\\)"
         lossscale ${LS_TINY} -q --set gpt.enabled=false --set train.lr=1e20 --set "train.recipes=[\"fp32\"]")
# Issue 18: a sharp attention (q/k initialised x 256: scores ~ 2e4) overflows fp16 scores (>= 65520
# rounds to inf), so every fp16 policy that stores the scores in fp16 has a nan loss from step 1
# (fp32 softmax output alone does not help); the policies that keep the scores in fp32 train.
add_test(NAME cli.lossscale_gpt_sharp
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/result_check.sh $<TARGET_FILE:mpt> lossscale_gpt_sharp
                 lossscale --config configs/lossscale_gpt_sharp.json
         WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
set_tests_properties(cli.lossscale_gpt_sharp PROPERTIES TIMEOUT 300)
cli_case(lossscale_gpt_bad_qk_scale 2 "/gpt/model/qk_init_scale: expected a number >= 0.0001 and <= 10000" lossscale --set gpt.model.qk_init_scale=0)
# Probe (stop 30): 1e-300 is 0 in fp32 and 6e5 overflows the fp16 weights (the sites then see only NaN).
cli_case(lossscale_gpt_tiny_qk_scale 2 "/gpt/model/qk_init_scale: expected a number >= 0.0001 and <= 10000, got 1e-300" lossscale --set gpt.model.qk_init_scale=1e-300)
cli_case(lossscale_gpt_huge_qk_scale 2 "/gpt/model/qk_init_scale: expected a number >= 0.0001 and <= 10000, got 600000" lossscale --set gpt.model.qk_init_scale=6e5)

# MPT_SIMD (core/numerics/rounding_simd): a value that names no level is a usage error, exit 2, nothing written.
cli_case_env(simd_malformed "MPT_SIMD=bogus" 2 "MPT_SIMD=\"bogus\": expected baseline, avx2 or avx512"
             lossscale ${LS_TINY})
# Probe (stop 30): refused before any work, as a config error is: under --print-config (was exit 0)
# and by the process that spawns --nproc workers.
cli_case_env(simd_malformed_print_config "MPT_SIMD=bogus" 2 "MPT_SIMD=\"bogus\": expected baseline, avx2 or avx512"
             underflow --print-config)
