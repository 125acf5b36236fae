# Parity of `mpt lossscale` section 1 (static loss-scale sweep) with PyTorch-Python. lossscale_ref.py
# checks section 1 only, so section 3 (the GPT, which has its own cases below) is off: on LibTorch
# 1.13 it took 40 of each case's 45-60 s.
parity_case(lossscale_sweep lossscale_ref.py lossscale --set train.enabled=false --set gpt.enabled=false)
parity_case(lossscale_overflow lossscale_ref.py lossscale --config configs/lossscale_overflow.json --set train.enabled=false --set gpt.enabled=false)
parity_case(lossscale_seed3_wide lossscale_ref.py lossscale --seed 3 --set sweep.model.width=32 --set sweep.model.depth=8 --set train.enabled=false --set gpt.enabled=false)
# Section 3 (the tiny GPT on fortunes), fp32 policy: the per-step losses bit for bit.
parity_case(lossscale_gpt lossscale_gpt_ref.py lossscale --set train.enabled=false --set gpt.steps=12 --set "gpt.policies=[\"fp32\"]")
parity_case(lossscale_gpt_seed5_3layers lossscale_gpt_ref.py lossscale --seed 5 --set train.enabled=false --set gpt.steps=8 --set gpt.model.layers=3 --set gpt.model.heads=2 --set "gpt.policies=[\"fp32\",\"fp16\"]")
