# Parity of `mpt expertparallel` with PyTorch-Python (tests/parity/expertparallel_ref.py): e Gloo
# processes of torch.distributed running the MoE GPT with its experts sharded over
# dist.all_to_all_single (an autograd Function, the same exchange on the gradient) and one process
# holding every expert. Every row of the vs_one_process (loss, logits, routing, expert and dense
# gradient differences, bounds), balance (with the per-step imbalance, dropped, loss and loads),
# tokens_per_expert, loss_curve, dropped_vs_capacity and comm (bytes sent, payload, formulas)
# tables equals Python's bit for bit.
parity_case(expertparallel_quick expertparallel_ref.py expertparallel --config configs/expertparallel_quick.json)
# 4 ranks (one expert each): a dense gradient is the all-reduce of 4 parts against one process's
# autograd sum of the same parts; both orders, and so the non-zero differences, are the same on
# both sides (the same Gloo all-reduce, the same autograd graph).
parity_case(expertparallel_nproc4 expertparallel_ref.py expertparallel --config configs/expertparallel_quick.json
            --nproc 4)
# Top-1: Switch's gate, the raw softmax prob of the one chosen expert (no renormalisation).
parity_case(expertparallel_top1 expertparallel_ref.py expertparallel --config configs/expertparallel_quick.json
            --set moe.top_k=1)
# Top-3 at capacity factor 0.7: N k cf / E = 32 x 3 x 0.7 / 4 = 16.8, so the capacity's ceiling
# (17, not 16) and the order of the k gated outputs' sum both show.
parity_case(expertparallel_top3_tight expertparallel_ref.py expertparallel --config configs/expertparallel_quick.json
            --set moe.top_k=3 --set moe.capacity_factor=0.7)
