#!/usr/bin/env python3
"""`mpt plan` against mpt's own runs: the bytes each term predicts vs the bytes the experiments measure.

Runs `mpt shard` (the tiny GPT, ZeRO stages 0-3, 2 processes), `mpt tensorparallel` (the quick
config, t = 2) and its mesh, `mpt contextparallel` (the quick config, c = 2), `mpt expertparallel`
(the quick config, e = 2) and its mesh, then `mpt plan` on the same model, batch and layout, and
compares term by term:

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

Prints a table (markdown, docs/plan.md "Own runs") and exits 1 when any term differs from the
prediction plus its named difference.

  /usr/bin/python3 tests/plan/own_runs.py build/mpt
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


def main():
    mpt = os.path.abspath(sys.argv[1])
    rows, failures = [], 0

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
        # the measurement is the smallest of 3 passes (Gloo's worker thread may still hold a collective's
        # temporary when a block returns); a run where one still did is repeated, up to 3 runs, the
        # smallest kept
        measured = {}
        for _ in range(3):
            tpd = run(mpt, tp_args, os.path.join(tmp, "tp.json"))
            for r in tpd["timings"]["activations_measured"]:
                measured[r["name"]] = min(measured.get(r["name"], r["measured"]), r["measured"])
            if all(measured[k] == v[0] + v[1] for k, v in expect.items()):
                break
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

    print("| run | term | measured bytes | plan bytes | difference | named difference | what it is | |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print(f"{len(rows) - failures} of {len(rows)} terms equal the plan plus their named difference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
