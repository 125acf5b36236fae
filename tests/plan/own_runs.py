#!/usr/bin/env python3
"""`mpt plan` against mpt's own runs: the bytes each term predicts vs the bytes the experiments measure.

Runs `mpt shard` (the tiny GPT, ZeRO stages 0-3, 2 processes), `mpt tensorparallel` (the quick
config, t = 2) and its mesh, `mpt contextparallel` (the quick config, c = 2), `mpt expertparallel`
(the quick config, e = 2) and its mesh, and the MLP experiments `mpt accumulate`, `mpt checkpoint`,
`mpt dataparallel`, `mpt pipeline`, `mpt fp8` and `mpt fp4` (planned as model.style mlp), then `mpt plan`
on the same model, batch and layout, and compares term by term:

- model states per rank (shard's tensors counted at the optimizer step) against plan's weights,
  gradients and master weights + optimizer states. The plan uses the ZeRO paper's accounting;
  mpt's ZeRO-1/2 (FSDP2-style) also keep an fp32 gradient shard (stage 1) and an fp32 master
  shard (stages 1-2) of 4Ψ/N bytes each: that difference is named and must be exact.
- DP/ZeRO payload bytes per step (shard's process-group counters) against plan's communication
  table: exact (ZeRO-2/3 reduce-scatter every microbatch in both) but for the plan's 8 B all-reduce of
  the loss for the log, which shard does not do.
- activation bytes per layer (tensorparallel's counting allocator) against plan's activations
  term (Korthikanti et al.'s per-layer terms, fp32, no dropout, scores stored). Named
  differences, exact: LayerNorm mean and rstd, 2 x 2 x 4sb (/t with SP); the causal mask, s^2
  bytes; with SP the all-gathered inputs autograd keeps for the column-parallel GEMMs,
  8sbh(1 - 1/t) (Megatron re-gathers them in backward).
- TP payload bytes per step (tensorparallel's counters) against plan's communication table
  (Megatron-LM's collectives): exact without SP; with SP the re-gathers mpt does not do are the
  named difference.
- the mesh (tensorparallel_mesh8: dp 2 x tp 2 x pp 2, 8 processes) against plan's communication
  table of the same layout: TP all-reduces and PP sends and receives exact; named, the mesh's DP
  all-reduce of every stage's gradients.
- context parallelism (contextparallel's quick config, c = 2): the activation bytes of a block on a
  CP rank (named: LayerNorm's mean and rstd and the masks as above; the ring keeps the log-sum-exp
  instead of the scores, all-gather and Ulysses the balanced split's index), and the payload per step of the ring's
  sends and receives, all-gather K/V's all-gathers and reduce-scatters and Ulysses' all-to-alls
  against the plan's cp terms of the same layout: exact; and the ring's sends and receives in the
  mesh dp 2 x cp 2 x tp 2 (tensorparallel_mesh_cp8), exact.
- expert parallelism (expertparallel's quick config: the MoE GPT of 1 layer, E = 4, top-2, capacity
  factor 1.25, e = 2 processes, each its own sequences: dp 2 with ep 2): the all-to-all payload of
  a step (dispatch, combine and their gradients, the process group's counter) against the plan's
  ep/all_to_all, and the expert weight bytes one rank holds against the plan's expert weights:
  exact; and the all-to-all bytes a rank sends per step in the mesh dp 2 x tp 2 with ep 2
  (expertparallel_mesh, 2 layers) against the plan's payload of the same layout, less the named
  1/ep a rank keeps (its own chunk).

- accumulate (its memory table: the MLP 784-128-128-10, batch 512 in k = 1, 2, 4, 8 micro-batches): the
  parameter and gradient bytes against the plan's weights and gradients, exact; each step's peak (the
  counting allocator) against the plan's activations for microbatch b, the difference the live set at the
  peak's moment of the backward (mlp_ce_step_peak: which tensors autograd still holds there).
- checkpoint (9 blocks Linear(16, 16) + ReLU + dropout, batch 64): the plain step's peak against the plan's
  activations with dropout, every checkpoint_sequential peak (s = 2, 4, sqrt n, n) against the plan's full
  recompute, the difference the live set at the peak (checkpoint_step_peak: the plain last segment's backward
  or the recomputation of the last checkpointed one, RNG states included).
- dataparallel (the quick config, N = 2): the gradient bytes its reducer all-reduces per step against the
  plan's dp all-reduce, less the loss's 8 B (all-reduced beside the buckets, not counted by the table).
- pipeline (its MLP 16-64x7-1 on 4 stages, GPipe and 1F1B, m = 1, 2, 4, 8): the (microbatch, chunk) pairs each
  stage holds at its peak must be the plan's (the schedule replayed), and the activation bytes the executor
  holds (largest stage) equal the plan's activations of that stage plus what the executor counts beyond
  autograd's (pipeline_stage_extra). The measured bubble is printed beside the plan's, never asserted.
- fp8 (the tiny config: MLP 784-128-128-10, the inner Linear in fp8; recipes tensorwise, rowwise, blockwise,
  mxfp8 as the plan's fp8-tensorwise, fp8-rowwise, fp8-blockwise, mxfp8) and fp4 (MLP 784-64-64-10, the inner
  Linear in 4 bits; nvfp4, mxfp4): the bytes each recipe keeps, measured in LibTorch's low-bit dtypes (its memory
  table's measured_parts), against the plan of the same recipe on every layer: the fp32 parameters and GEMM copies
  against the plan's weights + master + weight copies (named: -2Ψ, the master is the fp32 weights; the bf16 first
  and last Linear's one 2-byte copy instead of the recipe's); the scales against the plan's weight scales (named:
  the saved inputs' scales, which the plan's activations leave out; the bf16 Linears have none); the fp32
  gradients against the plan's with train.fp32_grads, exact; the saved inputs against the plan's activations
  (named: the quantized Linears' inputs in the recipe's element, not bf16; the loss's fp32 input, which the table
  does not count). Where this LibTorch lacks a dtype (Debian's 1.13: every low-bit one) the rows are unmeasured.

Prints a table (markdown, docs/plan.md "Own runs") and exits 1 when any term differs from the
prediction plus its named difference.

  /usr/bin/python3 tests/plan/own_runs.py build/mpt
  /usr/bin/python3 tests/plan/own_runs.py build/mpt --timings   # step times (step_times), not asserted
"""
import json
import os
import subprocess
import sys
import tempfile


def run(mpt, args, out):
    cmd = [mpt] + args + ["--out", out, "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    with open(out) as f:
        return json.load(f)


def plan_terms(mpt, sets, out):
    """The plan's memory terms and communication payloads (bytes per step), by name."""
    args = ["plan"]
    for s in sets:
        args += ["--set", s]
    d = run(mpt, args, out)
    mem = {r["name"]: r["bytes"] for r in d["results"]["memory"]}
    comm = {r["name"]: r["bytes"] for r in d["results"]["communication"]}
    return mem, comm


def plan_result(mpt, sets, out):
    """The whole result of `mpt plan` with `sets` (its tables under results)."""
    args = ["plan"]
    for s in sets:
        args += ["--set", s]
    return run(mpt, args, out)


def mlp_sets(widths, global_batch, microbatch, dp=1, pp=1, schedule="1f1b", optimizer="sgd", recompute="none",
             dropout=False):
    """`mpt plan` of the MLP `widths` (model.style mlp), fp32, ZeRO-0, as mpt's MLP experiments train it."""
    return ["model.preset=custom", "model.style=mlp", "model.widths=" + json.dumps(widths),
            f"model.dropout={'on' if dropout else 'off'}", "train.recipe=fp32", f"train.optimizer={optimizer}",
            f"train.recompute={recompute}", f"train.global_batch={global_batch}", f"train.microbatch={microbatch}",
            f"layout.dp={dp}", "layout.tp=1", f"layout.pp={pp}", "layout.zero=0", "layout.sequence_parallel=false",
            f"layout.schedule={schedule}"]


def mlp_ce_step_peak(widths, b):
    """The counting allocator's high-water mark in one micro-batch of `mpt accumulate`'s memory table:
    core/models/mlp's Linear + ReLU MLP of `widths`, cross-entropy (mean) times the micro-batch's share,
    fp32, the batch allocated before the measurement. Returns (bytes, moment, what is live).

    What is live follows from what autograd keeps and when it lets go (fp32, [b, w] tensors of 4bw bytes):
    the forward keeps each ReLU's output r_k (ReluBackward's result, also the next Linear's input: addmm's
    mat1) and frees each Linear's output z_k after its ReLU; the loss keeps log_softmax's output. The
    backward runs the nodes last to first and releases a node's saved tensors when it has run: the loss
    and backward's seed (ones_like(loss)) stay alive throughout (8 B); ReLU k's backward holds the gradient
    of r_k and writes that of z_k beside r_1..r_k; Linear k's backward holds the gradient of z_k (its bias
    gradient's source until validate_outputs has summed it) and writes the gradient of its input (but for
    the first layer: the data does not require grad), of its weight (4·w_k-1·w_k) and of its bias (4·w_k,
    the sum over the rows) beside r_1..r_k-1; AccumulateGrad adds each into .grad in place. The largest of
    these moments is the peak (the loss's forward, a few scalars aside, is below every one that matters)."""
    L = len(widths) - 1
    act = lambda k: 4 * b * widths[k]
    kept = lambda upto: sum(act(k) for k in range(1, upto + 1))  # r_1 .. r_upto
    scalars = 8  # the loss and backward's seed
    moments = []
    for k in range(1, L):
        moments.append((kept(k - 1) + 2 * act(k), f"ReLU {k}'s forward", f"r1..r{k - 1} + z{k} + r{k}"))
    moments.append((kept(L - 1) + 2 * act(L) + 16, "the loss's forward", f"r1..r{L - 1} + z{L} + log_softmax + scalars"))
    moments.append((kept(L - 1) + 3 * act(L) + scalars, "log_softmax's backward",
                    f"r1..r{L - 1} + log_softmax, its gradient and z{L}'s"))
    rs = lambda upto: "" if upto < 1 else (f"r1..r{upto} kept, " if upto > 1 else "r1 kept, ")
    for k in range(L, 0, -1):
        grads = act(k) + (act(k - 1) if k > 1 else 0) + 4 * widths[k - 1] * widths[k] + 4 * widths[k]
        moments.append((kept(k - 1) + grads + scalars, f"Linear {k}'s backward",
                        rs(k - 1) + f"gradients of z{k} 4b·{widths[k]}" +
                        (f", r{k - 1} 4b·{widths[k - 1]}" if k > 1 else "") +
                        f", W{k} 4·{widths[k - 1]}·{widths[k]}, b{k} 4·{widths[k]}"))
        if k > 1:
            moments.append((kept(k - 1) + 2 * act(k - 1) + scalars, f"ReLU {k - 1}'s backward",
                            rs(k - 1) + f"gradients of r{k - 1}, z{k - 1} 2·4b·{widths[k - 1]}"))
    moments.sort(key=lambda x: -x[0])
    assert moments[0][0] - moments[1][0] > 64, f"the peak's moment is ambiguous: {moments[:2]}"
    return moments[0]


# PyTorch's CPU generator state (torch.get_rng_state().numel(): CPUGeneratorImplState, the mt19937 state of 624
# words with its indices and the normal-sample caches), a uint8 tensor the counting allocator sees
CPU_RNG_STATE_BYTES = 5056


def checkpoint_step_peak(n, w, b, s):
    """The counting allocator's high-water mark in one step of `mpt checkpoint` (n blocks Linear(w, w) + ReLU +
    dropout, MSE, fp32, batch b, the input allocated before) with s segments (0: no checkpointing), as
    checkpoint_sequential splits them: s - 1 checkpointed segments of k = floor(n/s) blocks, the last of the
    m = n - (s - 1)k others, run plainly. Returns (bytes, moment, what is live), a = 4bw the bytes of a [b, w] tensor.

    What is live: a plain block keeps its ReLU output, its dropout noise (fp32, what mpt::dropout multiplies by)
    and its output (the next Linear's input): 3a; the loss is a 0-dim tensor that mse_loss leaves in a [b, w]
    buffer (a; the allocator sees two [b, w] in its forward, one released with the loss); backward's seed 4 B. A
    checkpointed segment keeps its input (the batch for the first: not counted) and the CPU RNG state at its entry;
    its backward sets the current state aside (one more) and recomputes the segment with grad: k blocks' 3a, then
    autograd.grad from the gradient of its output. Either of two moments is the peak: the last plain block's
    dropout backward (B: the gradients of its output and of its ReLU output beside everything kept), or the same
    moment inside the recomputation of the last checkpointed segment (A: the plain segment's tensors released by
    then, its output and the loss still held by the step)."""
    a = 4 * b * w
    if s == 0 or s == 1:  # no checkpointed segment: B with every block plain, the batch not counted
        return (3 * a * n + a + 2 * a + 4, f"block {n}'s dropout backward",
                f"3a·{n} kept (ReLU output, noise, output per block), the loss a, 2 gradients 2a, the seed 4 B")
    k = n // s
    m_last = n - (s - 1) * k
    seg_inputs = s - 2  # the inputs of segments 2 .. s-1 (segment 1's is the batch)
    rng = f"{CPU_RNG_STATE_BYTES} B"
    inputs = f", {seg_inputs} segment input(s) a·{seg_inputs}" if seg_inputs else ""
    moment_b = (CPU_RNG_STATE_BYTES * (s - 1) + a * (seg_inputs + 1 + 3 * m_last + 1 + 2) + 4,
                "the plain last segment's last dropout backward",
                f"its {m_last} blocks 3a·{m_last} and input a, 2 gradients 2a, the loss a{inputs}, {s - 1} RNG "
                f"state(s) of {rng}, the seed 4 B")
    moment_a = (CPU_RNG_STATE_BYTES * s + a * (seg_inputs + 2 + 1 + 3 * k + 1) + 4,
                f"segment {s - 1}'s recomputation (its last dropout backward)",
                f"the {k} recomputed block(s) 3a·{k}, 2 gradients 2a, the output and the loss 2a{inputs}, {s} RNG "
                f"states of {rng} ({s - 1} saved, 1 set aside), the seed 4 B")
    return max(moment_a, moment_b)


def pipeline_stage_extra(widths, p, stage, b):
    """Bytes per microbatch the pipeline executor counts on `stage` beyond the plan's activations (fp32, p
    even stages of L/p layers [i, j)): the executor keeps every hidden Linear's output z_k besides its ReLU
    output (the weight-gradient roots ZB-H1 needs; autograd's ReLU keeps only its output), 4b·w_k+1 each,
    and counts a stage's received input but not the batch on stage 0 (4b·w_0 fewer)."""
    L = len(widths) - 1
    i, j = stage * (L // p), (stage + 1) * (L // p)
    return 4 * b * (sum(widths[k] for k in range(i + 1, min(j, L - 1) + 1)) - (widths[0] if stage == 0 else 0))


def step_times(mpt, tmp):
    """--timings: the step time of mpt's own MLP runs against the plan's, on a system calibrated here.

    `mpt collectives` (the quick config) and `mpt plan --calibrate` measure this machine: GEMM rates by
    size (a Linear's three GEMMs on operands from memory), the operator overhead (a tiny MLP step less
    its GEMMs, / its operators) and the memory bandwidth. The plan's forward and backward (compute,
    elementwise, dispatch and gradient accumulation) is then compared with:

    - accumulate's memory table (the MLP 784-128-128-10, batch 512 in k = 1, 2, 4, 8 microbatches; the
      median of 100 steps). Named, in the same model: the step zeroes its gradients (zero_grads: 2L bare
      operators writing 4P bytes) rather than dropping them, so the first microbatch adds too (2L
      operators, 3 passes over 4P bytes), and slices x and y and flattens x per microbatch (3 bare
      operators: the calibration's "bare operator", an operator outside autograd).
    - checkpoint's step (9 blocks Linear(16, 16) + ReLU + dropout 0.1, batch 64, MSE; median of 100),
      plain and with n segments (full recompute). Named: zero_grads as above, the input's gradient
      (one more GEMM and operator: x requires grad), MSE's 2 operators instead of cross entropy's 6, the
      last block's ReLU and dropout (5 operators, 3 more recomputed); bare: zero_grads and the 2n + 1
      gradient clones after the step.

    A timing: printed, never asserted (docs/plan.md, "Step time of own runs")."""
    coll = os.path.join(tmp, "collectives.json")
    run(mpt, ["collectives", "--config", "configs/collectives_quick.json"], coll)
    cal = run(mpt, ["plan", "--calibrate", "--set", f"calibrate.collectives={coll}"], os.path.join(tmp, "system.json"))
    system = cal["timings"]["system"]
    alpha, bw = system["op_overhead_us"] * 1e-6, system["memory_bandwidth_gbps"] * 1e9
    bare = next(r["value"] for r in cal["timings"]["calibration"] if r["name"] == "bare operator") * 1e-6
    sysfile = os.path.join(tmp, "system.json")
    rows = []

    def planned(sets, name):
        pr = plan_result(mpt, sets + [f"system={sysfile}"], os.path.join(tmp, name))
        t = {r["name"]: r["seconds"] for r in pr["results"]["time"]}
        return sum(t.get(k, 0) for k in ("compute", "elementwise", "dispatch", "gradient accumulation"))

    def row(name, measured, plan, named_ops, bare_ops, named_bytes, named_s, why):
        named = named_ops * alpha + bare_ops * bare + named_bytes / bw + named_s
        predicted = plan + named
        rows.append((name, measured * 1e3, plan * 1e3, named * 1e3, predicted * 1e3,
                     100 * (predicted - measured) / measured, why))

    aw = [784, 128, 128, 10]
    L, P = len(aw) - 1, sum(aw[k] * aw[k + 1] + aw[k + 1] for k in range(len(aw) - 1))
    ad = run(mpt, ["accumulate", "--set", "train.steps=2", "--set", "timing.repeats=100"], os.path.join(tmp, "acc_t.json"))
    batch = ad["config"]["memory"]["batch"]
    for name, t in ad["timings"]["memory_step_time"].items():
        k = int(name.split("/")[1])
        plan = planned(mlp_sets(aw, batch, batch // k), f"plan_acc_t{k}.json")
        row(f"accumulate {name} (MLP {'-'.join(map(str, aw))}, b = {batch // k})", t["step_s"], plan,
            2 * L, 2 * L + 3 * k, 16 * P, 0,
            f"the first microbatch's adds: {2 * L} operators; zero_grads {2 * L}, slices and flatten {3 * k} bare "
            f"operators; 16P = {16 * P} B")

    cn, cw, cb = 9, 16, 64
    cd = run(mpt, ["checkpoint", "--set", f"model.depth={cn}", "--set", f"model.width={cw}", "--set", f"data.batch={cb}",
                   "--set", "checkpoint.no_rng_row=false", "--set", "checkpoint.sweep=false", "--set", "timing.repeats=100"],
             os.path.join(tmp, "ck_t.json"))
    cwidths = [cw] * (cn + 1)
    cP = cn * (cw * cw + cw)
    sysd = parse_rates(system)
    x_grad = gemm_seconds(sysd, cb, cw, cw)  # the input's gradient: x requires grad
    for key, rec, extra in (("none", "none", 0), (f"s={cn} (n)", "full", 3)):
        t = cd["timings"]["step_time_s"].get(key)
        if t is None:
            continue
        plan = planned(mlp_sets(cwidths, cb, cb, dropout=True, recompute=rec), f"plan_ck_t_{rec}.json")
        ops = 2 * cn + 1 - 4 + 5 + extra
        row(f"checkpoint {key} ({cn} blocks of {cw}, b = {cb})", t["step_s"], plan, ops, 2 * cn + 2 * cn + 1,
            16 * cP + 4 * (cP + cb * cw), x_grad,
            f"the first add {2 * cn}, x's gradient +1, MSE -4, the last block's ReLU and dropout +{5 + extra}: {ops} "
            f"operators; zero_grads {2 * cn} and clones {2 * cn + 1} bare operators; 16P + the clones' 4(P + bw) B; x's GEMM")

    print(f"\nStep time (forward and backward) against the plan on this machine as calibrated here "
          f"(operator overhead {alpha * 1e6:.2f} us, pass overhead {system.get('pass_overhead_us', 0):.1f} us, "
          f"bare operator {bare * 1e6:.2f} us, memory {bw / 1e9:.1f} GB/s; "
          f"a timing: reported, never asserted):")
    print("| run | measured ms | plan ms | named ms | plan + named ms | error % | named |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:+.1f} | {r[6]} |")


def parse_rates(system):
    """The fp32 GEMM rates of a calibrated system, [(N, FLOP/s)] N ascending, and its fp32 peak x efficiency."""
    return ([(n, tf * 1e12) for n, tf in system["gemm_tflops_by_n"]["fp32"]],
            system["peak_tflops"]["fp32"] * 1e12 * system["gemm_efficiency"])


def gemm_seconds(rates_peak, m, n, k):
    """System::gemm_seconds for fp32 (src/core/plan/plan_model.cpp): the rate of an N^3 product with the same
    FLOPs, log-log between the measured sizes, the smallest's below them and, above, the larger of the largest's
    and peak x efficiency."""
    import math
    rates, peak = rates_peak
    size, flops = (m * n * k) ** (1 / 3), 2 * m * n * k
    if size <= rates[0][0]:
        return flops / rates[0][1]
    if size > rates[-1][0]:
        return flops / max(rates[-1][1], peak)
    i = next(j for j in range(1, len(rates)) if rates[j][0] >= size)
    f = math.log(size / rates[i - 1][0]) / math.log(rates[i][0] / rates[i - 1][0])
    return flops / math.exp(math.log(rates[i - 1][1]) + f * (math.log(rates[i][1]) - math.log(rates[i - 1][1])))


def weight_copy_bytes(recipe, rows, cols):
    """The plan's quantized copies of one weight matrix [rows, cols] (outputs, inputs) and their scales, bytes
    (core/plan/plan_detail.hpp's weight_copy_bytes: partial blocks padded; rowwise and MX a second copy of W^T)."""
    c = lambda n, blk: -(-n // blk)
    n = rows * cols
    return {"fp8-tensorwise": (n, 4), "fp8-rowwise": (2 * n, 4 * rows + 4 * cols),
            "fp8-blockwise": (n, 4 * c(rows, 128) * c(cols, 128)),
            "mxfp8": (2 * n, rows * c(cols, 32) + cols * c(rows, 32)),
            "nvfp4": (c(n, 2), c(rows, 16) * c(cols, 16) + 4),
            "mxfp4": (2 * c(n, 2), rows * c(cols, 32) + cols * c(rows, 32))}[recipe]


# The scales of the input a quantized Linear saves for its weight gradient (wgrad's operand x^T [k, b], blocks
# along the batch: core/numerics/quant's recipes), bytes: the plan's activations count no scales
SAVED_INPUT_SCALES = {"fp8-tensorwise": lambda k, b: 4, "fp8-rowwise": lambda k, b: 4 * k,
                      "fp8-blockwise": lambda k, b: 4 * k * -(-b // 128), "mxfp8": lambda k, b: k * -(-b // 32),
                      "nvfp4": lambda k, b: k * -(-b // 16) + 4, "mxfp4": lambda k, b: k * -(-b // 32)}
# what the plan counts per weight-matrix element for the recipe's copies (weight_copy_bytes)
COPY_BYTES = {"fp8-tensorwise": "1 B", "fp8-rowwise": "2 x 1 B (W and W^T)", "fp8-blockwise": "1 B",
              "mxfp8": "2 x 1 B (W and W^T)", "nvfp4": "1/2 B", "mxfp4": "2 x 1/2 B (W and W^T)"}
# bytes per element of the saved input: the recipe's element (E4M3 1, E2M1 1/2), the plan's bf16 2
SAVED_INPUT_BYTES = {"fp8-tensorwise": 1, "fp8-rowwise": 1, "fp8-blockwise": 1, "mxfp8": 1, "nvfp4": 0.5, "mxfp4": 0.5}


def low_precision_runs(mpt, tmp, compare, unmeasured, exp, d, widths, quantized, b, recipes, layers_note, system):
    """Rows for `mpt fp8` / `mpt fp4` result `d` (its memory table): for each experiment recipe in `recipes` (mapped
    to the plan's recipe), the weights + master + copies, the weight scales, the gradients and the activations
    measured against `mpt plan` of the MLP `widths`, microbatch b, that recipe on every layer. quantized[k]: Linear
    k in the recipe (else bf16: one 2-byte copy, no scales, its input kept in bf16)."""
    fm = {r["name"]: r for r in d["results"]["memory"]}
    if fm["fp32"]["measured_parts"] is None:
        unmeasured.append(f"{exp} weights, scales, gradients and activations: this LibTorch has no low-bit dtypes to "
                          "measure them in")
        return
    psi = fm["fp32"]["measured_parts"]["weights"] // 4  # the fp32 row: 4 B per parameter
    L = len(widths) - 1
    shape = lambda k: (widths[k + 1], widths[k])  # W_k [out, in]
    name = f"MLP {'-'.join(map(str, widths))}, {layers_note}"
    edges = [k for k in range(L) if not quantized[k]]
    inner = [k for k in range(L) if quantized[k]]
    first = True
    for rname, precipe in recipes.items():
        if fm[rname]["measured_parts"] is None:
            unmeasured.append(f"{exp} {rname}: this LibTorch lacks a dtype of the recipe")
            continue
        mp = fm[rname]["measured_parts"]
        sets = [x.replace("train.recipe=fp32", f"train.recipe={precipe}") for x in mlp_sets(widths, b, b)]
        p, _ = plan_terms(mpt, sets + ["train.fp32_grads=true", system], os.path.join(tmp, f"plan_{exp}_{rname}.json"))
        fmt_ = "fp4" if precipe in ("nvfp4", "mxfp4") else "fp8"
        run_name = f"{exp} {rname} ({name})"
        # the bf16 edges: one 2-byte copy where the plan counts the recipe's copies and scales
        edge_copies = sum(2 * shape(k)[0] * shape(k)[1] - weight_copy_bytes(precipe, *shape(k))[0] for k in edges)
        edge_scales = sum(weight_copy_bytes(precipe, *shape(k))[1] for k in edges)
        edge_s = " + ".join(f"{shape(k)[0]}x{shape(k)[1]}" for k in edges)
        compare(run_name, f"weights + master + {fmt_} copies", mp["weights"],
                p["weights"] + p["master weights"] + p[f"{fmt_} weight copies"], -2 * psi + edge_copies,
                f"-2Ψ: its master is its fp32 weights, no bf16 copy of every parameter; {edge_copies:+d}: the bf16 "
                f"Linears ({edge_s}) keep one copy of 2 B per element, not the recipe's {COPY_BYTES[precipe]}")
        saved = sum(SAVED_INPUT_SCALES[precipe](widths[k], b) for k in inner)
        compare(run_name, f"{fmt_} scales", mp["scales"], p[f"{fmt_} weight scales"], saved - edge_scales,
                f"+{saved}: the scales of the {fmt_} Linears' saved inputs x^T [{' + '.join(str(widths[k]) for k in inner)}, "
                f"{b}] (activations, the plan counts none); -{edge_scales}: the bf16 Linears' weights have none (the plan's: "
                f"{', '.join(f'{shape(k)[0]}x{shape(k)[1]} {weight_copy_bytes(precipe, *shape(k))[1]}' for k in edges)})")
        if first:  # the same fp32 gradients in every recipe
            compare(f"{exp} (every recipe, {name})", "gradients (fp32)", mp["gradients"], p["gradients"], 0, "")
        first = False
        # activations: each Linear's saved input, the quantized ones in the recipe's element; the plan's bf16 inputs
        # and the fp32 loss input (the experiment's table counts the Linears' inputs only)
        low = sum(int((2 - SAVED_INPUT_BYTES[precipe]) * b * widths[k]) for k in inner)
        compare(run_name, "activations (saved inputs)", mp["activations"], p["activations"], -low - 4 * b * widths[-1],
                f"-{low}: the {fmt_} Linears' inputs kept in {SAVED_INPUT_BYTES[precipe]:g} B per element for wgrad, "
                f"not bf16's 2; -{4 * b * widths[-1]}: the loss's fp32 input 4b·{widths[-1]} (the table counts the "
                f"Linears' inputs only)")


def main():
    if "--timings" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            step_times(os.path.abspath(sys.argv[1]), tmp)
        return 0
    mpt = os.path.abspath(sys.argv[1])
    rows, failures, bubbles, held_failures, unmeasured = [], 0, [], 0, []

    def compare(run_name, term, measured, predicted, named, why):
        nonlocal failures
        ok = measured == predicted + named
        failures += not ok
        rows.append((run_name, term, measured, predicted, measured - predicted, named, why, "ok" if ok else "FAIL"))

    with tempfile.TemporaryDirectory() as tmp:
        # --- shard: model states per rank, ZeRO 0-3 on the tiny GPT (N = 2, Adam, fp32)
        # ZeRO-2/3 reduce-scatter every microbatch, as the plan (and DeepSpeed) do: a rank then holds
        # only its gradient shard between microbatches
        sh = run(mpt, ["shard", "--config", "configs/shard_gpt.json", "--set", "zero.reduce_every_micro_batch=true"],
                 os.path.join(tmp, "shard.json"))
        cfg = sh["config"]
        g = cfg["model"]["gpt"]
        L, h, ctx, heads = g["layers"], g["width"], g["context"], g["heads"]
        n = cfg["nproc"]
        mem = {r["name"]: r for r in sh["results"]["memory"]}
        psi = mem["stage0"]["params"] // 4  # fp32 parameters
        # the corpus decides the vocabulary: Ψ = L(12h² + 13h) + s·h + 2h + 2V·h (untied head, no bias)
        rest = psi - (L * (12 * h * h + 13 * h) + ctx * h + 2 * h)
        assert rest % (2 * h) == 0, f"Ψ = {psi} is no tiny GPT of width {h}"
        vocab = rest // (2 * h)
        micro = cfg["train"]["global_batch"] // (n * cfg["train"]["micro_batches"])
        base = ["model.preset=mpt-gpt", f"model.layers={L}", f"model.hidden={h}", f"model.heads={heads}",
                f"model.sequence={ctx}", f"model.vocab={vocab}", f"model.ffn={g['mlp_ratio'] * h}",
                "train.recipe=fp32", f"train.optimizer={cfg['train'].get('optimizer', 'adam')}",
                f"train.global_batch={cfg['train']['global_batch']}", f"train.microbatch={micro}",
                f"layout.dp={n}", "layout.tp=1", "layout.pp=1"]
        # per step: a run's payload over its steps (whole bytes for these runs; a fraction would fail below)
        comm = {r["name"]: r["payload_bytes"] for r in sh["results"]["comm"] if "payload_bytes" in r}
        comm = {k: int(v) if v == int(v) else v for k, v in comm.items()}
        for z in (0, 1, 2, 3):
            p, pc = plan_terms(mpt, base + [f"layout.zero={z}"], os.path.join(tmp, f"plan_z{z}.json"))
            m = mem[f"stage{z}"]
            shard4 = 4 * psi // n
            compare(f"shard stage {z}", "weights", m["params"], p["weights"], 0, "")
            compare(f"shard stage {z}", "gradients", m["grads"], p["gradients"], shard4 if z == 1 else 0,
                    "fp32 gradient shard 4Ψ/N beside the full gradients" if z == 1 else "")
            compare(f"shard stage {z}", "master + optimizer", m["optimizer"], p["master weights"] + p["optimizer states"],
                    shard4 if z in (1, 2) else 0, "fp32 master shard 4Ψ/N (FSDP2-style)" if z in (1, 2) else "")
            # DP/ZeRO payload per step (dist::Group's counters); the tiny GPT's rows divide by N, so
            # ZeRO's per-parameter padding adds nothing here
            kinds = sorted({k.split("/", 1)[1] for k in comm if k.startswith(f"stage{z}/")} |
                           {k.split("/", 1)[1] for k in pc if k.startswith("dp/")})
            for k in kinds:
                logged = -8 if k == "all_reduce" else 0  # the plan's loss mean for the log (Megatron-LM's train_step)
                compare(f"shard stage {z}", f"dp {k} bytes/step", comm.get(f"stage{z}/{k}", 0), pc.get(f"dp/{k}", 0),
                        logged, "shard logs rank 0's loss: no 8 B all-reduce of it" if logged else "")

        # --- tensorparallel: activation bytes per layer, one process, TP, TP + SP (t = 2)
        tp_args = ["tensorparallel", "--config", "configs/tensorparallel_quick.json"]
        tc = json.loads(subprocess.run([mpt] + tp_args + ["--print-config"], capture_output=True, text=True,
                                       check=True).stdout)
        s, b = tc["data"]["seq"], tc["data"]["batch"]
        h, heads, L, t = tc["model"]["width"], tc["model"]["heads"], tc["model"]["layers"], tc["nproc"]
        expect, comm_expect = {}, []
        for name, tt, sp in (("one_process", 1, False), ("tp", t, False), ("tp_sp", t, True)):
            p, pc = plan_terms(mpt, ["model.preset=mpt-gpt", f"model.layers={L}", f"model.hidden={h}", f"model.heads={heads}",
                                 f"model.sequence={s}", f"model.vocab={tc['model']['vocab']}", f"model.ffn={4 * h}",
                                 "train.recipe=fp32", "train.recompute=none", "train.flash_attention=false",
                                 f"train.global_batch={b}", f"train.microbatch={b}", "layout.dp=1", f"layout.tp={tt}",
                                 "layout.pp=1", f"layout.sequence_parallel={'true' if sp else 'false'}"],
                           os.path.join(tmp, f"plan_{name}.json"))
            named = 16 * s * b // (tt if sp else 1) + s * s + (8 * s * b * h - 8 * s * b * h // tt if sp else 0)
            why = "LayerNorm mean and rstd 16sb" + ("/t" if sp else "") + " + causal mask s^2" + \
                  (" + all-gathered GEMM inputs 8sbh(1 - 1/t)" if sp else "")
            expect[name] = (p["activations"] // L, named, why)
            # TP payload per step: Megatron-LM's collectives; with SP mpt keeps the all-gathered inputs of
            # the column-parallel GEMMs (2 per layer and the head's: the activation rows' difference)
            # instead of gathering them again for the weight gradients
            act = 4 * s * b * h
            if name == "tp":
                comm_expect.append((name, "all_reduce", pc.get("tp/all_reduce", 0), 0, ""))
            if name == "tp_sp":
                comm_expect.append((name, "all_gather", pc.get("tp/all_gather", 0), -(2 * L + 1) * act,
                                    "no re-gather of the 2L + 1 column-parallel inputs, -(2L + 1)·4sbh"))
                comm_expect.append((name, "reduce_scatter", pc.get("tp/reduce_scatter", 0), 0, ""))
                comm_expect.append((name, "all_reduce", pc.get("tp/all_reduce", 0), 0, ""))
        # the live-byte counts are process-wide: another thread's allocation or release inside a block's
        # window (Gloo's worker, which mpt settles before each reading, or the job's own threads) moves a
        # reading by a few bytes now and then. A run whose readings are not all the prediction is repeated,
        # up to 3 runs; a row counts as equal when one run measured exactly the prediction (a change of the
        # model moves every run), else its smallest reading is reported
        seen = {}
        for _ in range(3):
            tpd = run(mpt, tp_args, os.path.join(tmp, "tp.json"))
            for r in tpd["timings"]["activations_measured"]:
                seen.setdefault(r["name"], []).append(r["measured"])
            if all(v[0] + v[1] in seen.get(k, []) for k, v in expect.items()):
                break
        measured = {k: (expect[k][0] + expect[k][1] if k in expect and expect[k][0] + expect[k][1] in vs else min(vs))
                    for k, vs in seen.items()}
        for name, (per_layer, named, why) in expect.items():
            compare(f"tensorparallel {name}", "activations per layer", measured[name], per_layer, named, why)
        tp_comm = {r["name"]: r["payload_bytes"] for r in tpd["results"]["comm"]}
        for name, kind, predicted, named, why in comm_expect:
            compare(f"tensorparallel {name}", f"tp {kind} bytes/step", tp_comm.get(f"{name}/{kind}", 0), predicted, named, why)

        # --- tensorparallel's mesh (dp 2 x tp 2 x pp 2, 8 processes, SGD): the traffic of a step on the first
        # and the last stage's rank against the plan's communication table for each stage
        mesh_args = ["tensorparallel", "--config", "configs/tensorparallel_mesh8.json"]
        mc = json.loads(subprocess.run([mpt] + mesh_args + ["--print-config"], capture_output=True, text=True,
                                       check=True).stdout)
        md = run(mpt, mesh_args, os.path.join(tmp, "mesh.json"))
        mcomm = {r["name"]: r["payload_bytes"] for r in md["results"]["mesh_comm"]}
        g, ms = mc["model"], mc["mesh"]
        t, pp, dp = ms["tp"], ms["pp"], ms["dp"]
        s, b, h = mc["data"]["seq"], mc["data"]["batch"], g["width"]
        vpad = -(-g["vocab"] // (g["vocab_divisible_by"] * t)) * g["vocab_divisible_by"] * t  # Megatron's padding
        mesh_base = ["model.preset=mpt-gpt", f"model.layers={g['layers']}", f"model.hidden={h}",
                     f"model.heads={g['heads']}", f"model.sequence={s}", f"model.vocab={vpad}",
                     f"model.ffn={g['mlp_ratio'] * h}", "train.recipe=fp32", "train.optimizer=sgd",
                     "train.recompute=none", f"train.global_batch={dp * b}", f"train.microbatch={b // ms['microbatches']}",
                     f"layout.dp={dp}", f"layout.tp={t}", "layout.zero=0", "layout.sequence_parallel=false",
                     f"layout.schedule={ms['schedule']}"]
        _, last = plan_terms(mpt, mesh_base + [f"layout.pp={pp}"], os.path.join(tmp, "plan_mesh.json"))
        # the plan models the last stage; the first stage's TP traffic is the whole model's (pp = 1) less it
        _, whole = plan_terms(mpt, mesh_base + ["layout.pp=1"], os.path.join(tmp, "plan_mesh_pp1.json"))
        compare("mesh first stage", "tp all_reduce bytes/step", mcomm.get("first/tp/all_reduce", 0),
                whole.get("tp/all_reduce", 0) - last.get("tp/all_reduce", 0), 0, "")
        compare("mesh last stage", "tp all_reduce bytes/step", mcomm.get("last/tp/all_reduce", 0),
                last.get("tp/all_reduce", 0), 0, "")
        for kind in ("send", "recv"):
            compare("mesh last stage", f"pp {kind} bytes/step", mcomm.get(f"last/pp/{kind}", 0), last.get(f"pp/{kind}", 0),
                    0, "")
        # DP: the mesh's Reducer all-reduces the gradients of every stage (each rank keeps the whole TP shard of
        # the model for the checks)
        compare("mesh last stage", "dp all_reduce bytes/step", mcomm.get("last/dp/all_reduce", 0),
                last.get("dp/all_reduce", 0), whole.get("dp/all_reduce", 0) - last.get("dp/all_reduce", 0),
                "every stage's gradients reduced on every rank (the checks keep the whole model): + the other stage's")

        # --- contextparallel (the quick config, c = 2): each attention's CP payload per step (one forward and
        # backward of B sequences: one microbatch) against the plan's cp terms of the same layout, exact
        cp_args = ["contextparallel", "--config", "configs/contextparallel_quick.json"]
        cd = run(mpt, cp_args, os.path.join(tmp, "cp.json"))
        g, c = cd["config"]["model"], cd["env"]["cp_degree"]
        s, b = cd["config"]["data"]["seq"], cd["config"]["data"]["batch"]
        measured_act = {r["name"]: int(r["max_rank"]) for r in cd["timings"]["activations_measured"]}
        balanced = cd["config"]["cp"]["split"] == "balanced"
        sl, a = s // c, g["heads"]
        for row in cd["results"]["comm"]:
            p, pc = plan_terms(mpt, ["model.preset=mpt-gpt", f"model.layers={g['layers']}", f"model.hidden={g['width']}",
                                     f"model.heads={g['heads']}", f"model.sequence={s}", f"model.vocab={g['vocab']}",
                                     f"model.ffn={g['mlp_ratio'] * g['width']}", "train.recipe=fp32",
                                     "train.recompute=none", "train.flash_attention=false",
                                     f"train.global_batch={b}", f"train.microbatch={b}",
                                     "layout.dp=1", "layout.tp=1", "layout.pp=1", "layout.zero=0", f"layout.cp={c}",
                                     f"layout.cp_attention={row['name']}"],
                              os.path.join(tmp, f"plan_cp_{row['name']}.json"))
            # activation bytes of a block on a CP rank (the counting allocator) against the plan's per layer
            v = row["name"]
            named = 16 * sl * b  # LayerNorm mean and rstd, as tensorparallel's
            why = "LayerNorm mean and rstd 16sb"
            if v == "ring":
                named += 4 * a * sl * b - 4 * a * sl * s * b
                why += " + the log-sum-exp 4asb, no scores 4asSb (recomputed in backward)"
            elif v == "all_gather":
                named += sl * s + (8 * s if balanced else 0)
                why += " + the mask sS" + (" + the natural-order index 8S" if balanced else "")
            else:
                named += s * s + (16 * s if balanced else 0)
                why += " + the causal mask S^2" + (" + the index and its inverse 16S" if balanced else "")
            compare(f"contextparallel {v} (c = {c})", "activations per layer", measured_act[v],
                    p["activations"] // g["layers"], named, why)
            kinds = sorted(set(row["payloads"]) | {k.split("/", 1)[1] for k in pc if k.startswith("cp/")})
            for k in kinds:
                compare(f"contextparallel {row['name']} (c = {c})", f"cp {k} bytes/step", row["payloads"].get(k, 0),
                        pc.get(f"cp/{k}", 0), 0, "")

        # --- the mesh with context parallelism (tensorparallel_mesh_cp8: dp 2 x cp 2 x tp 2, the ring): the ring's
        # sends and receives of a step on one rank against the plan's cp terms of the same layout (K/V of a TP
        # rank's heads), exact
        cp8_args = ["tensorparallel", "--config", "configs/tensorparallel_mesh_cp8.json"]
        c8 = json.loads(subprocess.run([mpt] + cp8_args + ["--print-config"], capture_output=True, text=True,
                                       check=True).stdout)
        c8d = run(mpt, cp8_args, os.path.join(tmp, "mesh_cp8.json"))
        c8comm = {r["name"]: r["payload_bytes"] for r in c8d["results"]["mesh_comm"]}
        g, ms = c8["model"], c8["mesh"]
        t, dp, cpd = ms["tp"], ms["dp"], ms["cp"]
        vpad = -(-g["vocab"] // (g["vocab_divisible_by"] * t)) * g["vocab_divisible_by"] * t
        _, pc8 = plan_terms(mpt, ["model.preset=mpt-gpt", f"model.layers={g['layers']}", f"model.hidden={g['width']}",
                                  f"model.heads={g['heads']}", f"model.sequence={c8['data']['seq']}", f"model.vocab={vpad}",
                                  f"model.ffn={g['mlp_ratio'] * g['width']}", "train.recipe=fp32", "train.optimizer=sgd",
                                  "train.recompute=none", f"train.global_batch={dp * c8['data']['batch']}",
                                  f"train.microbatch={c8['data']['batch'] // ms['microbatches']}", f"layout.dp={dp}",
                                  f"layout.tp={t}", f"layout.cp={cpd}", f"layout.cp_attention={ms['cp_attention']}",
                                  "layout.pp=1", "layout.zero=0", "layout.sequence_parallel=false"],
                           os.path.join(tmp, "plan_mesh_cp8.json"))
        for kind in ("send", "recv"):
            compare(f"mesh dp {dp} x cp {cpd} x tp {t}", f"cp {kind} bytes/step", c8comm.get(f"first/cp/{kind}", 0),
                    pc8.get(f"cp/{kind}", 0), 0, "")

        # --- expertparallel (the quick config, e = 2): the MoE GPT on dp = ep = e ranks, each routing its own
        # sequences (one microbatch per step); the all-to-all payload of a step and the expert weights one rank
        # holds against the plan's ep/all_to_all and expert weights of the same layout, exact
        ep_args = ["expertparallel", "--config", "configs/expertparallel_quick.json"]
        ed = run(mpt, ep_args, os.path.join(tmp, "ep.json"))
        ec = ed["config"]
        # the vocabulary is the corpus's (not in the result): the same corpus as shard's, whose Ψ gave it above
        assert (ec["data"]["text_dir"], ec["data"]["text_files"]) == (cfg["data"]["text_dir"], cfg["data"]["text_files"]), \
            "expertparallel and shard read different corpora: the vocabulary derived from shard's Ψ does not apply"
        g, mo, e = ec["model"], ec["moe"], ed["env"]["ep_degree"]
        b = ec["data"]["batch"]

        def moe_sets(g, mo, dp, ep, t, microbatch, optimizer):
            return ["model.preset=mpt-moe", f"model.layers={g['layers']}", f"model.hidden={g['width']}",
                    f"model.heads={g['heads']}", f"model.sequence={g['context']}", f"model.vocab={vocab}",
                    f"model.ffn={g['mlp_ratio'] * g['width']}", f"model.experts={mo['experts']}",
                    f"model.top_k={mo['top_k']}", f"train.capacity_factor={mo['capacity_factor']}",
                    "train.recipe=fp32", f"train.optimizer={optimizer}", "train.recompute=none",
                    f"train.global_batch={dp * microbatch}", f"train.microbatch={microbatch}", f"layout.dp={dp}",
                    f"layout.ep={ep}", f"layout.tp={t}", "layout.pp=1", "layout.zero=0",
                    "layout.sequence_parallel=false"]

        pe, pce = plan_terms(mpt, moe_sets(g, mo, e, e, 1, b, "sgd-momentum"), os.path.join(tmp, "plan_ep.json"))
        pm = {r["name"]: r["value"] for r in json.load(open(os.path.join(tmp, "plan_ep.json")))["results"]["moe"]}
        ecomm = ed["results"]["comm"][0]
        assert ecomm["capacity"] == pm["capacity"], (ecomm["capacity"], pm["capacity"])
        compare(f"expertparallel (e = {e})", "ep all_to_all bytes/step", int(ecomm["payload"]), pce.get("ep/all_to_all", 0),
                0, "")
        compare(f"expertparallel (e = {e})", "expert weights", int(ecomm["expert_weight_bytes"]), pe["expert weights"], 0, "")

        # --- expertparallel's mesh (expertparallel_mesh: dp 2 x tp 2, ep 2, 2 layers, no SP: every TP rank of an EP
        # pair exchanges its own copy of its tokens): the all-to-all bytes a rank sends per step against the plan's
        # ep/all_to_all payload of the same layout, which a rank hands its group whole and keeps 1/ep of
        em_args = ["expertparallel", "--config", "configs/expertparallel_mesh.json"]
        emc = json.loads(subprocess.run([mpt] + em_args + ["--print-config"], capture_output=True, text=True,
                                        check=True).stdout)
        emd = run(mpt, em_args, os.path.join(tmp, "ep_mesh.json"))
        ms = emc["mesh"]
        _, pcm = plan_terms(mpt, moe_sets(emc["model"], emc["moe"], ms["dp"], ms["ep"], ms["tp"], emc["data"]["batch"], "sgd"),
                            os.path.join(tmp, "plan_ep_mesh.json"))
        payload = pcm.get("ep/all_to_all", 0)
        # every step sends the same bytes (fixed by the shapes): the first step's, or the first step that differs
        steps = emd["results"]["mesh"]
        row = next((r for r in steps if int(r["a2a_sent"]) != int(steps[0]["a2a_sent"])), steps[0])
        compare(f"mesh dp {ms['dp']} x tp {ms['tp']}, ep {ms['ep']} (step {row['step']} of {len(steps)})",
                "ep all_to_all sent bytes/step", int(row["a2a_sent"]), payload, -payload // ms["ep"],
                "a rank keeps its own chunk: (ep - 1)/ep of the payload is sent")

        # --- accumulate (the MLP 784-h-h-10 of its memory table, SGD, fp32): the parameter and gradient bytes
        # against the plan's weights and gradients, exact; the peak of one accumulated step of micro-batches
        # of b against the plan's activations for microbatch b, with the step's own terms named
        # (mlp_ce_step_peak: the peak is a moment of the backward, not the forward's kept activations)
        ad = run(mpt, ["accumulate", "--set", "train.steps=2", "--set", "timing.repeats=1", "--set", "data.samples=512",
                       "--set", "memory.batch=512"], os.path.join(tmp, "accumulate.json"))
        ac = ad["config"]["memory"]
        aw = [784, ac["hidden"], ac["hidden"], 10]
        amem = ad["results"]["memory"]
        for r in amem:
            B, b = ac["batch"], r["micro_batch"]
            assert B % r["micro_batches"] == 0, "unequal micro-batches: the plan's microbatch is one size"
            pa, _ = plan_terms(mpt, mlp_sets(aw, B, b), os.path.join(tmp, f"plan_acc_{r['micro_batches']}.json"))
            if r is amem[0]:
                compare(f"accumulate MLP {'-'.join(map(str, aw))}", "weights", r["param_bytes"], pa["weights"], 0, "")
                compare(f"accumulate MLP {'-'.join(map(str, aw))}", "gradients", r["grad_bytes"], pa["gradients"], 0, "")
            peak, moment, live = mlp_ce_step_peak(aw, b)
            compare(f"accumulate {r['name']} (b = {b})", "step peak vs activations", r["peak_bytes"], pa["activations"],
                    peak - pa["activations"],
                    f"peak in {moment}: {live}, the loss and its seed 8 B; of the plan's Linear inputs "
                    f"4b·({' + '.join(map(str, aw[:-1]))}) and loss input 4b·{aw[-1]} the rest is released, the batch "
                    f"4b·{aw[0]} allocated before")

        # --- checkpoint (n blocks Linear(w, w) + ReLU + dropout, MSE, fp32, batch b): the plain step's peak against
        # the plan's activations without recompute, each checkpoint_sequential peak against the plan's full
        # recompute (one layer per segment: Chen et al. 2016's n segments), the step's own terms named
        # (checkpoint_step_peak: every peak is a moment of the backward)
        cd = run(mpt, ["checkpoint", "--set", "model.depth=9", "--set", "model.width=16", "--set", "data.batch=64",
                       "--set", "checkpoint.no_rng_row=false", "--set", "checkpoint.sweep=false", "--set",
                       "timing.repeats=1"], os.path.join(tmp, "checkpoint.json"))
        cm = cd["config"]["model"]
        assert cm["precision"] == "fp32" and cm["dropout"] > 0, "the named terms are fp32 with dropout's noise"
        cn, cw, cb = cm["depth"], cm["width"], cd["config"]["data"]["batch"]
        ca = 4 * cb * cw
        cwidths = [cw] * (cn + 1)
        p_none, _ = plan_terms(mpt, mlp_sets(cwidths, cb, cb, dropout=True), os.path.join(tmp, "plan_ck_none.json"))
        p_full, _ = plan_terms(mpt, mlp_sets(cwidths, cb, cb, dropout=True, recompute="full"),
                               os.path.join(tmp, "plan_ck_full.json"))
        for r in cd["results"]["segments"]:
            s_ = r["segments"]
            peak, moment, live = checkpoint_step_peak(cn, cw, cb, s_)
            if s_ in (0, 1):  # no checkpointing (s = 1: one plain segment)
                # the plan's n Linear inputs, n - 1 ReLU outputs with 1-byte masks and the loss input, against the live
                # set: the batch not counted, fp32 noise for the masks, the last block's ReLU and dropout (the plan's
                # MLP ends in a bare Linear), the loss's buffer, the backward's two gradients and the seed
                assert peak - p_none["activations"] == -ca + 3 * cb * cw * (cn - 1) + 2 * ca + ca + 2 * ca + 4
                why = (f"peak in {moment} (a = 4bw): - the batch a (allocated before) + 3bw·{cn - 1} (fp32 noise, not "
                       f"1-byte masks) + 2a (the last block's ReLU output and noise: the plan's MLP ends in a bare "
                       f"Linear) + a (the loss's [b, w] buffer) + 2a + 4 B (2 gradients, the seed)")
                compare(f"checkpoint {r['name']} ({cn} blocks, b = {cb})", "step peak vs activations", r["peak_bytes"],
                        p_none["activations"], peak - p_none["activations"], why)
            else:
                why = (f"peak in {moment} (a = 4bw): {live}; less the plan's {cn} layer inputs and loss input "
                       f"a·{cn + 1} (the batch among them, allocated before)")
                compare(f"checkpoint {r['name']} (k = {cn // s_})", "step peak vs full-recompute activations",
                        r["peak_bytes"], p_full["activations"], peak - p_full["activations"], why)

        # --- dataparallel (the quick config: MLP 784-h-10, N = 2 processes, SGD, fp32): the gradient bytes its
        # reducer all-reduces per step (the buckets) against the plan's dp all-reduce of the same layout
        dd = run(mpt, ["dataparallel", "--config", "configs/dataparallel_quick.json", "--set", "train.nosync_steps=0"],
                 os.path.join(tmp, "dataparallel.json"))
        dc = dd["config"]["train"]
        for r in dd["results"]["training"]:
            n = int(r["name"][1:])
            if n < 2:
                continue
            _, pcd = plan_terms(mpt, mlp_sets([784, dc["hidden"], 10], dc["global_batch"], dc["global_batch"] // n, dp=n),
                                os.path.join(tmp, f"plan_dp{n}.json"))
            compare(f"dataparallel N = {n} (MLP 784-{dc['hidden']}-10)", "dp all_reduce bytes/step", r["bytes"],
                    pcd.get("dp/all_reduce", 0), -8,
                    "the table counts the gradient buckets; the loss's 8 B all-reduce for the log runs beside them")

        # --- pipeline (its default MLP, p stages, GPipe and 1F1B, m = 1 .. 8): the activation bytes the executor
        # holds at its peak (largest stage) against the plan's activations of that stage x the (microbatch,
        # chunk) pairs the schedule holds there; the pairs held per stage must be the plan's (replayed)
        pd = run(mpt, ["pipeline", "--set", 'pipeline.schedules=["gpipe","1f1b"]', "--set", "pipeline.microbatches=[1,2,4,8]",
                       "--set", "pipeline.steps=1", "--set", "sync.enabled=false"], os.path.join(tmp, "pipeline.json"))
        pcf = pd["config"]["pipeline"]
        pw, pp_, batch = pcf["widths"], pcf["stages"], pcf["batch"]
        assert (len(pw) - 1) % pp_ == 0, "uneven stages: the plan splits the layers evenly"
        measured_bubble = {r["name"]: r for r in pd["timings"]["measured"]}
        for r in pd["results"]["sweep"]:
            if r["schedule"] not in ("gpipe", "1f1b"):
                continue
            b = batch // r["microbatches"]
            pr = plan_result(mpt, mlp_sets(pw, batch, b, pp=pp_, schedule=r["schedule"]),
                             os.path.join(tmp, f"plan_{r['name']}.json"))
            stages = pr["results"]["mlp_stages"]
            held = [st["held"] for st in stages]
            if held != [int(x) for x in r["peak_held_per_stage"].split(",")]:
                held_failures += 1
                print(f"FAIL: {r['name']}: microbatches held per stage {r['peak_held_per_stage']}, the plan's {held}")
            s = max(range(pp_), key=lambda k: (stages[k]["activations"] + held[k] * pipeline_stage_extra(pw, pp_, k, b), -k))
            per = (len(pw) - 1) // pp_
            compare(f"pipeline {r['name']} (p = {pp_}, b = {b})", f"activations held, stage {s} (the largest)",
                    r["peak_bytes"], stages[s]["activations"], held[s] * pipeline_stage_extra(pw, pp_, s, b),
                    f"{held[s]} x (+ its hidden layers' pre-activations z 4b·("
                    f"{' + '.join(str(pw[k]) for k in range(s * per + 1, min((s + 1) * per, len(pw) - 2) + 1))}), the "
                    f"executor's weight-gradient roots"
                    + (f"; - the batch 4b·{pw[0]}, not counted on stage 0" if s == 0 else "")
                    + ")")
            mb = measured_bubble.get(r["name"])
            if mb:
                bubbles.append(f"{r['name']}: measured {mb['bubble']:.3f}, theory {mb['bubble_theory']:.3f}, "
                               f"the plan's {pr['results']['summary']['bubble_fraction']:.3f}")

        # --- fp8 (the tiny config: MLP 784-128-128-10, the inner Linear in fp8) and fp4 (its tiny config: MLP
        # 784-64-64-10, the inner Linear in 4 bits): per recipe the bytes each keeps, measured in LibTorch's low-bit
        # dtypes (core/numerics/quant's measured_stored_bytes: its fp32 parameters and each Linear's GEMM copies, their
        # scales and the input saved for wgrad, fp32 gradients), against the plan's weights, master weights, weight
        # copies, weight scales, gradients (fp32: train.fp32_grads) and activations of the same recipe on every layer;
        # the named difference is the bf16 first and last Linear (the experiments' edges, which no 32- or 128-block
        # divides) and what the experiment keeps that the plan's terms leave out. LibTorch without the low-bit dtypes
        # (Debian's 1.13) measures none: then unmeasured
        fd = run(mpt, ["fp8", "--config", "configs/fp8_tiny.json", "--set",
                       'recipes=["fp32","tensorwise","rowwise","blockwise","mxfp8"]'], os.path.join(tmp, "fp8.json"))
        fw = [784] + fd["config"]["model"]["hidden"] + [10]
        inner = fd["config"]["model"]["fp8_layers"] == "inner"
        low_precision_runs(mpt, tmp, compare, unmeasured, "fp8", fd, fw,
                           [not inner or 0 < k < len(fw) - 2 for k in range(len(fw) - 1)],
                           fd["config"]["train"]["batch"],
                           {"tensorwise": "fp8-tensorwise", "rowwise": "fp8-rowwise", "blockwise": "fp8-blockwise",
                            "mxfp8": "mxfp8"}, f"fp8_layers {fd['config']['model']['fp8_layers']}", "system=h100-sxm-dgx")
        # fp4: no shipped system has an fp4 peak; the memory terms do not read it: the H100's system with a
        # hypothetical fp4 peak (twice its fp8) lets the plan run
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "systems",
                               "h100-sxm-dgx.json")) as f:
            sys4 = json.load(f)
        sys4["name"] += ", with a hypothetical fp4 peak for the own runs' memory terms"
        sys4["peak_tflops"]["fp4"] = 2 * sys4["peak_tflops"]["fp8"]
        with open(os.path.join(tmp, "system_fp4.json"), "w") as f:
            json.dump(sys4, f)
        f4 = run(mpt, ["fp4", "--set", "train.steps=6", "--set", "data.train_samples=1024", "--set", "data.test_samples=200",
                       "--set", "model.hidden=[64,64]", "--set", "ledger.step=2", "--set", 'variants=["fp32","nvfp4","mxfp4"]'],
                 os.path.join(tmp, "fp4.json"))
        f4w = [784] + f4["config"]["model"]["hidden"] + [10]
        low_precision_runs(mpt, tmp, compare, unmeasured, "fp4", f4, f4w,
                           [0 < k < len(f4w) - 2 for k in range(len(f4w) - 1)], f4["config"]["train"]["batch"],
                           {"nvfp4": "nvfp4", "mxfp4": "mxfp4"}, "the first and last Linear in bf16",
                           "system=" + os.path.join(tmp, "system_fp4.json"))

    print("| run | term | measured bytes | plan bytes | difference | named difference | what it is | |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print(f"{len(rows) - failures} of {len(rows)} terms equal the plan plus their named difference")
    for u in unmeasured:
        print(f"unmeasured here: {u}")
    print("\nThe pipeline's bubble (idle / step, per stage mean; reported, never asserted: a timing):")
    for line in bubbles:
        print("  " + line)
    return 1 if failures or held_failures else 0


if __name__ == "__main__":
    sys.exit(main())
