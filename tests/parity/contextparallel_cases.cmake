# Parity of `mpt contextparallel` with PyTorch-Python (tests/parity/contextparallel_ref.py): c Gloo
# processes of torch.distributed running the ring (isend/irecv), all-gather (all_gather, then
# reduce-scatter backward) and Ulysses (all_to_all_single) attentions as autograd Functions. Every row
# of the attention (vs one process, vs exact, bound), gpt (loss, logits, per-parameter gradients),
# balance (pairs) and comm (bytes sent) tables equals Python's bit for bit.
parity_case(contextparallel_quick contextparallel_ref.py contextparallel --config configs/contextparallel_quick.json)
parity_case(contextparallel_contiguous contextparallel_ref.py contextparallel --config configs/contextparallel_quick.json
            --set cp.split=contiguous)
# 4 ranks: the dK/dV reduce-scatter, the loss and the gradient all-reduces sum 4 terms, in the order
# of the same Gloo collective (or mpt's ring reduce-scatter, mirrored) on both sides.
parity_case(contextparallel_nproc4 contextparallel_ref.py contextparallel --config configs/contextparallel_quick.json
            --nproc 4)
