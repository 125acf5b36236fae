# Parity of `mpt checkpoint` with torch.utils.checkpoint.checkpoint_sequential (python3-torch):
# loss, gradient differences (0 with RNG restored, the same non-zero value without) and
# recomputed blocks (counted by forward hooks in PyTorch) equal bit for bit.
parity_case(checkpoint_tiny checkpoint_ref.py checkpoint --set model.depth=9 --set model.width=16 --set data.batch=64
            --set timing.repeats=1 --set checkpoint.sweep=false)
parity_case(checkpoint_default checkpoint_ref.py checkpoint --set timing.repeats=1 --set checkpoint.sweep=false)
parity_case(checkpoint_depth16_p05 checkpoint_ref.py checkpoint --seed 3 --set model.depth=16 --set model.dropout=0.5
            --set "checkpoint.segments=[\"3\",\"8\",\"sqrt\"]" --set timing.repeats=1 --set checkpoint.sweep=false)
parity_case(checkpoint_fp16 checkpoint_ref.py checkpoint --set model.precision=fp16 --set model.depth=12
            --set timing.repeats=1 --set checkpoint.sweep=false)
parity_case(checkpoint_bf16 checkpoint_ref.py checkpoint --set model.precision=bf16 --set model.depth=12
            --set timing.repeats=1 --set checkpoint.sweep=false)
# Dropout probabilities outside the five mpt::dropout checks at start-up (core/models/mlp'
# dropout_kernel), an odd batch and width (sizes not a multiple of the 4-word tempering or the
# 512-draw block): mpt's own Bernoulli loop against nn.Dropout's bernoulli_.
parity_case(checkpoint_p095_odd checkpoint_ref.py checkpoint --seed 7 --set model.dropout=0.95 --set model.depth=10
            --set model.width=13 --set data.batch=77 --set timing.repeats=1 --set checkpoint.sweep=false)
parity_case(checkpoint_p0333 checkpoint_ref.py checkpoint --set model.dropout=0.3333 --set model.depth=8
            --set timing.repeats=1 --set checkpoint.sweep=false)
