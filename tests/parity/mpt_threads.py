"""The intra-op thread count of the mpt run a reference mirrors.

mpt chooses its threads on purpose (env.threads_policy: the usable cores divided among the
machine's mpt processes, or the config's /threads); a reduction split across threads can sum
in another order, so a bit-for-bit reference must run with the same count. Call use() once,
before any tensor work, with the mpt result file the reference reads.
"""
import json

import torch


def use(result_path, per_rank=False):
    """torch.set_num_threads(mpt's env.threads) — with per_rank, the count of one rank of a
    multi-process run (env.threads_policy.intra_op, which every rank shares). Returns it."""
    env = json.load(open(result_path)).get("env", {})
    n = env.get("threads_policy", {}).get("intra_op") if per_rank else None
    n = n or env.get("threads") or torch.get_num_threads()
    torch.set_num_threads(int(n))
    return int(n)
