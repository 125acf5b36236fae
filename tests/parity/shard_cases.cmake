# Parity of `mpt shard` with PyTorch-Python (tests/parity/shard_ref.py): the one-process reference
# (torch.optim.SGD, the ranks' local batches summed in rank order) and the whole-batch run; every
# stage's loss curve and its difference from the whole-batch run equal Python's bit for bit.
parity_case(shard_sgd shard_ref.py shard --config configs/shard_quick.json --set optimizer.name=sgd
            --set optimizer.lr=0.05 --set mixed.compare=false --set zero.compare_every_micro_batch=false)
parity_case(shard_sgd_momentum_seed3 shard_ref.py shard --config configs/shard_quick.json --seed 3
            --set optimizer.name=sgd --set optimizer.lr=0.05 --set optimizer.momentum=0.9 --set train.micro_batches=4
            --set train.global_batch=32 --set train.samples=512 --set mixed.compare=false --set zero.compare_every_micro_batch=false)
parity_case(shard_sgd_one_process shard_ref.py shard --config configs/shard_quick.json --nproc 1
            --set optimizer.name=sgd --set optimizer.lr=0.05 --set mixed.compare=false --set zero.compare_every_micro_batch=false)
# The tiny GPT (tests/parity/shard_gpt_ref.py): the same claims on the fortunes corpus, 2 ranks, 2 micro-batches.
parity_case(shard_gpt_sgd shard_gpt_ref.py shard --config configs/shard_quick.json --set model.name=gpt
            --set model.gpt.layers=1 --set model.gpt.width=16 --set model.gpt.heads=2 --set model.gpt.context=8
            --set train.global_batch=8 --set train.steps=3 --set optimizer.name=sgd --set optimizer.lr=0.05
            --set optimizer.momentum=0.9 --set mixed.compare=false --set zero.compare_every_micro_batch=false)
