# Parity of `mpt accumulate` with PyTorch-Python (python3-torch): gradient differences, both
# training curves, normalisation errors and the BatchNorm comparison equal bit for bit. Needs Fashion-MNIST.
parity_case(accumulate_default accumulate_ref.py accumulate --set timing.repeats=1 --set "memory.micro_batches=[1]")
parity_case(accumulate_seed5 accumulate_ref.py accumulate --seed 5 --set batch=48 --set "micro_batches=[3,5]"
            --set train.steps=5 --set train.micro_batches=6 --set timing.repeats=1 --set "memory.micro_batches=[1]")
