"""The intra-op thread count of the mpt run a reference mirrors.

mpt chooses its threads on purpose (env.threads_policy: the usable cores divided among the
machine's mpt processes, or the config's /threads); a reduction split across threads can sum
in another order, so a bit-for-bit reference must run with the same count. Call use() once,
before any tensor work, with the mpt result file the reference reads. use() also resolves
oneMKL's VML dispatch in one thread first, as every mpt process does (resolve_vml_dispatch in
src/core/runtime/runtime.hpp): a VML function's first call made on two threads at once can run a
low-accuracy kernel on one thread's chunk (pytorch/pytorch#188792).
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
    resolve_vml_dispatch()
    return int(n)


# The ATen unary ops whose float and double kernels call oneMKL's VML (ATen/cpu/vml.h), the
# list mpt warms (src/core/runtime/runtime.cpp, resolve_vml_dispatch).
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin", "sqrt",
           "tan", "tanh", "trunc")


def resolve_vml_dispatch():
    """Each VML-routed op once on a 1-element fp32 and fp64 tensor: below every grain size, so
    in this thread only, before any parallel region can make a VML function's first call."""
    with torch.inference_mode():
        for dtype in (torch.float32, torch.float64):
            x = torch.full((1,), 0.5, dtype=dtype)
            for name in VML_OPS:
                getattr(torch, name)(x)
