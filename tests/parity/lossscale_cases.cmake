# Parity of `mpt lossscale` section 1 (static loss-scale sweep) with PyTorch-Python.
parity_case(lossscale_sweep lossscale_ref.py lossscale --set train.enabled=false)
parity_case(lossscale_overflow lossscale_ref.py lossscale --config configs/lossscale_overflow.json --set train.enabled=false)
parity_case(lossscale_seed3_wide lossscale_ref.py lossscale --seed 3 --set sweep.model.width=32 --set sweep.model.depth=8 --set train.enabled=false)
