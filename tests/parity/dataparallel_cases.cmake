# Parity of `mpt dataparallel` sections 1-2 with PyTorch-Python (tests/parity/dataparallel_ref.py).
parity_case(dataparallel_default dataparallel_ref.py dataparallel --set train.enabled=false)
parity_case(dataparallel_seed7 dataparallel_ref.py dataparallel --set train.enabled=false --seed 7
            --set equivalence.batch=128 --set equivalence.shards=8 --set equivalence.uneven_samples=101
            --set equivalence.uneven_shards=4)
