// mpt tensorparallel, section 6 — the GPT on a DP x TP x PP mesh (/mesh/steps > 0: this section
// alone): the mesh of core/parallel/mesh, each stage's blocks TP-sharded on the pipeline executor,
// the DP mean by dataparallel's Reducer, SGD; checked after every step against the same TP model
// without pipeline and DP, and reported against one process; the traffic of its steps per group
// (mesh_comm), which `mpt plan`'s own runs compare to the plan's. See tensorparallel.cpp.
#include <array>
#include <cmath>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/parallel/cp.hpp"
#include "core/parallel/ddp.hpp"
#include "core/parallel/mesh.hpp"
#include "core/parallel/reference.hpp"
#include "core/parallel/tp.hpp"
#include "core/parallel/tp_gpt.hpp"
#include "core/pipeline/executor.hpp"
#include "core/runtime/runtime.hpp"
#include "experiments/tensorparallel_parts.hpp"

namespace mpt {

namespace {

// ----------------------------------------------------------------------------
// 6. The DP x TP x PP mesh (/mesh/steps > 0: this section alone)
// ----------------------------------------------------------------------------
// Rank layout ("pp", "dp", "tp"), tp fastest (MeshLayout, core/parallel/mesh: Megatron-LM's default order,
// torchtitan's DeviceMesh): rank = (pp_idx·dp + dp_idx)·tp + tp_idx. Each rank joins three
// groups: its TP group (the Column/Row-parallel collectives of its stage), its PP group (the
// pipeline executor's send/recv, tp-rank i of stage s to tp-rank i of stage s + 1) and its DP
// group (the gradient all-reduce of dataparallel's dist::Reducer, then ÷ dp: DDP's mean). One step: the executor runs the
// schedule over the DP rank's m microbatches (each loss ÷ m), the DP mean, SGD θ -= lr·g.
//
// The references, on every rank, same seed and global batch (dp·b sequences):
//  (a) the same TP model on its TP group without pipeline and DP: for each DP shard d the m
//      microbatches through all blocks in order (loss ÷ m, gradients accumulated in .grad as the
//      executor's B's do, in microbatch order), then (G_0 + G_1 + ...) ÷ dp, the same SGD. A cut
//      between stages changes no arithmetic (core/pipeline/stage.hpp) and a two-term all-reduce
//      is a + b = b + a, so for dp <= 2 the mesh's parameters equal (a)'s bit for bit: bound 0,
//      checked every step. (Gloo may add dp > 2 terms in another order: then reported.)
//  (b) one process, the plain TinyGpt (torch::linear, F.cross_entropy), the same microbatches,
//      the same mean and SGD: the mesh's shards gathered to full shape against it, reported
//      (the TP arithmetic differs from it by the per-operation reordering bounds the TP
//      sections check; propagated through the network and the steps there is no closed bound).

/// Plain SGD, θ −= lr·g, on every rank's copy alike (torch.optim.SGD without momentum).
void sgd(const std::vector<torch::Tensor>& ps, const std::vector<torch::Tensor>& gs, double lr) {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < ps.size(); ++i) ps[i].add_(gs[i], -lr);
}

/// The rank layout: one row per rank, its coordinates and its groups.
Table mesh_layout_table(const MeshLayout& mesh) {
  Table lt{"mesh_layout", fmt::format("Rank layout of the dp {} x cp {} x tp {} x pp {} mesh (ranks in pp, dp, cp, tp order: "
                                      "tp fastest)", mesh.dp, mesh.cp, mesh.tp, mesh.pp),
           {text_col("name", "rank"), int_col("pp", "pp"), int_col("dp", "dp"), int_col("cp", "cp"), int_col("tp", "tp"),
            text_col("tp_group", "TP group"), text_col("cp_group", "CP group"), text_col("dp_group", "DP group"),
            text_col("pp_group", "PP group")}};
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int r : v) out += (out.empty() ? "" : " ") + std::to_string(r);
    return out;
  };
  for (int r = 0; r < mesh.size(); ++r) {
    const auto c = mesh.coord(r);
    lt.rows.push_back({{"name", fmt::format("rank{}", r)}, {"pp", static_cast<int64_t>(c.pp)},
                       {"dp", static_cast<int64_t>(c.dp)}, {"cp", static_cast<int64_t>(c.cp)},
                       {"tp", static_cast<int64_t>(c.tp)}, {"tp_group", list(mesh.tp_group(c.pp, c.dp, c.cp))},
                       {"cp_group", list(mesh.cp_group(c.pp, c.dp, c.tp))},
                       {"dp_group", list(mesh.dp_group(c.pp, c.tp, c.cp))}, {"pp_group", list(mesh.pp_group(c.dp, c.tp, c.cp))}});
  }
  lt.notes.push_back("rank = ((pp_idx * dp + dp_idx) * cp + cp_idx) * tp + tp_idx: Megatron-LM's order tp-cp-ep-dp-pp, "
                     "torch's init_device_mesh(..., (pp, dp, cp, tp))");
  return lt;
}

/// The three models of the mesh section, built on every rank from one seed, and their parameter
/// lists in one order (pipeline chunk by chunk): the mesh's, the TP reference's (a), the plain
/// model's (b), with where each TP shard goes back in the full model.
struct MeshModels {
  TinyGpt full{nullptr};  // the one-process model (reference b), trained in place
  torch::Tensor idx, tgt;  // the global batch, dp·b sequences
  torch::Tensor cp_pos;    // this rank's positions of every sequence (undefined without context parallelism)
  std::unique_ptr<cp::Attention> mesh_attn, ref_attn;  // the CP attention of the mesh's and the TP ref's blocks
  std::unique_ptr<tp::TpGpt> mesh_model, ref_model;
  std::unique_ptr<tp::TpGptStages> stages, ref_stages;
  std::vector<torch::Tensor> mesh_ps, ref_ps, full_ps;
  std::vector<const tp::ShardedParam*> sharded;
};

MeshModels build_mesh_models(const Config& cfg, const Mesh& mesh) {
  const GptConfig gc = gpt_of(cfg);
  const int64_t div = cfg.integer("/model/vocab_divisible_by"), b = cfg.integer("/data/batch"),
                T = cfg.integer("/data/seq");
  const int dp = mesh.layout().dp, pp = mesh.layout().pp;
  MeshModels mm;
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  mm.full = TinyGpt(gc);
  mm.idx = torch::randint(gc.vocab, {dp * b, T}, torch::kLong);
  mm.tgt = torch::randint(gc.vocab, {dp * b, T}, torch::kLong);
  mm.mesh_model = std::make_unique<tp::TpGpt>(mm.full, mesh.tp(), div, false);
  mm.ref_model = std::make_unique<tp::TpGpt>(mm.full, mesh.tp(), div, false);
  if (mesh.layout().cp > 1) {
    const auto split = cp::split_from_name(cfg.str("/mesh/cp_split"));
    const auto variant = cp::variant_from_name(cfg.str("/mesh/cp_attention"));
    mm.cp_pos = cp::positions(T, mesh.layout().cp, mesh.coord().cp, split);
    mm.mesh_attn = std::make_unique<cp::Attention>(mesh.cp(), variant, split);
    mm.ref_attn = std::make_unique<cp::Attention>(mesh.cp(), variant, split);
    mm.mesh_model->set_context_parallel(mm.mesh_attn->hook(), mm.cp_pos);
    mm.ref_model->set_context_parallel(mm.ref_attn->hook(), mm.cp_pos);
  }
  mm.stages = std::make_unique<tp::TpGptStages>(*mm.mesh_model, pp);
  mm.ref_stages = std::make_unique<tp::TpGptStages>(*mm.ref_model, pp);
  for (int c = 0; c < pp; ++c)
    for (auto& p : mm.stages->parameters(c)) mm.mesh_ps.push_back(p);
  for (int c = 0; c < pp; ++c)
    for (auto& p : mm.ref_stages->parameters(c)) mm.ref_ps.push_back(p);
  for (int c = 0; c < pp; ++c)
    for (std::size_t i = 0; i < mm.mesh_model->params().size(); ++i)
      if (mm.stages->chunk_of(i) == c) mm.sharded.push_back(&mm.mesh_model->params()[i]);
  const auto named = mm.full->named_parameters();
  for (const auto* sp : mm.sharded) mm.full_ps.push_back(named[sp->name]);
  return mm;
}

/// This rank's tokens of rows [row, row + b) of the global batch: every position, or its CP share.
std::pair<torch::Tensor, torch::Tensor> local_rows(const MeshModels& mm, int64_t row, int64_t b) {
  auto x = mm.idx.narrow(0, row, b), y = mm.tgt.narrow(0, row, b);
  if (mm.cp_pos.defined()) return {x.index_select(1, mm.cp_pos), y.index_select(1, mm.cp_pos)};
  return {x, y};
}

/// The CP mean of gradients (and of the loss): a sum over the CP group, then ÷ cp — after the DP
/// mean, in the mesh and in reference (a) alike. None without context parallelism.
/// One flat all-reduce (a bucket, as the DP Reducer's): elementwise sums, so the same bits as
/// one all-reduce per tensor.
void cp_mean(const std::shared_ptr<dist::Group>& g, std::vector<torch::Tensor>& ts) {
  if (!g || g->size() == 1 || ts.empty()) return;
  std::vector<torch::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  auto bucket = torch::cat(flat);
  g->allreduce(bucket);
  bucket.div_(g->size());
  int64_t at = 0;
  for (auto& t : ts) {
    const int64_t n = t.numel();
    t = bucket.narrow(0, at, n).view(t.sizes()).clone();
    at += n;
  }
}

/// The single-process replay of one mesh step, on every rank: for each reference, every DP shard's
/// microbatches in order, its gradients taken, summed over the shards, then divided by dp (as the
/// mesh's DP all-reduce), the same SGD — (a) TP (and CP, on its CP group: the mesh's CP mean
/// after the DP mean) without pipeline and DP, (b) the plain model on whole sequences. Returns
/// (b)'s mean loss over the DP shards.
double replay_references(MeshModels& mm, const std::shared_ptr<dist::Group>& cpg, int dp, int pp, int m, int64_t b,
                         double lr) {
  // DP shard d of the step's batch: rows d·b .. (d+1)·b − 1; its microbatches in order (b is a
  // multiple of m: validate_mesh), the shards' gradients summed, then divided by dp.
  const reference::LocalBatch shard = [&](int64_t d, int64_t) { return local_rows(mm, d * b, b); };
  const reference::LocalBatch whole = [&](int64_t d, int64_t) {
    return std::make_pair(mm.idx.narrow(0, d * b, b), mm.tgt.narrow(0, d * b, b));
  };
  auto shard_mean = [&](std::vector<torch::Tensor>& ps, const reference::LossFn& loss_of,
                        const reference::LocalBatch& batch) {
    return reference::rank_mean_gradient(ps, loss_of, batch, 0, dp, m, reference::Mean::DivideSum);
  };
  // (a) TP on the TP group (and CP on the CP group), no pipeline, no DP.
  auto ref_g = shard_mean(mm.ref_ps, [&](const torch::Tensor& x, const torch::Tensor& y) {
                 torch::Tensor h = x;
                 for (int c = 0; c < pp; ++c) h = mm.ref_stages->forward(c, h);
                 return mm.ref_stages->loss(h, y);
               }, shard).first;
  cp_mean(cpg, ref_g);
  sgd(mm.ref_ps, ref_g, lr);
  // (b) one process, the plain model.
  auto [full_g, loss1] = shard_mean(mm.full_ps, [&](const torch::Tensor& x, const torch::Tensor& y) {
    return gpt_loss(mm.full->forward(x), y);
  }, whole);
  sgd(mm.full_ps, full_g, lr);
  return loss1;
}

/// One step on the mesh: the pipeline over this rank's PP group, the DP mean of the gradients by
/// dataparallel's dist::Reducer (one bucketed all-reduce, then ÷ dp; none when dp = 1), SGD.
/// Returns the global batch's mean loss.
double mesh_step(const Mesh& mesh, MeshModels& mm, dist::Reducer* reducer, const std::vector<std::vector<PipeOp>>& sched,
                 int m, int64_t b, double lr) {
  ProcessPipelineOptions popts;  // this rank's pipeline: its stages' job ranks key the trace's flows
  popts.job_ranks = mesh.ranks("pp");
  const int d = mesh.coord().dp;
  const auto [x, y] = local_rows(mm, d * b, b);
  const PipelineRun run = run_pipeline_process(mesh.pp(), *mm.stages, sched, m, x, y, SyntheticCost{}, popts);
  auto loss_t = torch::tensor({run.loss}, torch::kFloat64);
  std::vector<torch::Tensor> grads = run.grads;
  if (reducer) {
    // The Reducer all-reduces what .grad holds (DDP's path for gradients accumulated without
    // sync): dp <= 2 terms per element, a + b = b + a, then one division — the same bits as
    // summing one flat buffer.
    for (std::size_t i = 0; i < mm.mesh_ps.size(); ++i) mm.mesh_ps[i].mutable_grad() = grads[i];
    reducer->set_sync(true);
    reducer->finalize();
    reducer->set_sync(false);
    for (std::size_t i = 0; i < mm.mesh_ps.size(); ++i) grads[i] = mm.mesh_ps[i].grad();
    mesh.dp()->allreduce(loss_t);
    loss_t.div_(mesh.layout().dp);
  }
  // Context parallelism: each CP rank's loss is its tokens' mean, and the CP ranks' shares are
  // equal, so the mean over the CP group is the whole sequences' mean (Megatron reduces over the
  // dp x cp group at once; here DP first, then CP, as reference (a) does: two two-term sums).
  std::vector<torch::Tensor> loss_v{loss_t};
  cp_mean(mesh.cp(), grads);
  cp_mean(mesh.cp(), loss_v);
  loss_t = loss_v[0];
  sgd(mm.mesh_ps, grads, lr);
  return loss_t.item<double>();
}

/// The mesh's traffic per step: every rank's process-group counters (payload bytes and calls per
/// group and collective, summed over the steps' mesh_step calls only: the references' collectives
/// are not counted), gathered to every rank; docs/plan.md's own runs compare them to `mpt plan`.
struct MeshComm {
  static constexpr std::array<const char*, 4> kGroups{"tp", "dp", "pp", "cp"};
  static constexpr std::array<const char*, 6> kKinds{"all_reduce", "all_gather", "reduce_scatter", "send", "recv",
                                                     "all_to_all"};
  static constexpr int kPerRank = 4 * 6 * 2;  // (group, kind) x (calls, payload)
  std::vector<double> mine = std::vector<double>(kPerRank, 0.0);

  static void reset(const Mesh& mesh) {
    for (const char* g : kGroups) mesh.group(g)->reset_comm_counts();
  }
  void add(const Mesh& mesh) {
    for (std::size_t gi = 0; gi < kGroups.size(); ++gi) {
      const auto counts = mesh.group(kGroups[gi])->comm_counts();
      for (std::size_t ki = 0; ki < kKinds.size(); ++ki) {
        const auto it = counts.find(kKinds[ki]);
        if (it == counts.end()) continue;
        const std::size_t at = 2 * (gi * kKinds.size() + ki);
        mine[at] += static_cast<double>(it->second.calls);
        mine[at + 1] += static_cast<double>(it->second.payload_bytes);
      }
    }
  }
  /// Rows for the ranks of the first and the last stage at dp = tp = 0, per step (all ranks take part).
  Table table(World& w, const Mesh& mesh, int64_t steps) const {
    auto all = torch::zeros({w.size(), kPerRank}, torch::kFloat64);
    all[w.rank()].copy_(torch::tensor(mine, torch::kFloat64));
    w.group()->allreduce(all);
    const MeshLayout& lay = mesh.layout();
    Table tb{"mesh_comm", "Communication per step of a first- and a last-stage rank (dp 0, tp 0), counted by the mesh's "
                          "process groups during the mesh's steps",
             {text_col("name", "rank / group / collective"), float_col("calls", "calls"),
              int_col("payload_bytes", "payload", "B")}};
    for (int stage : {0, lay.pp - 1}) {
      const int r = lay.rank_of(stage, 0, 0);
      for (std::size_t gi = 0; gi < kGroups.size(); ++gi)
        for (std::size_t ki = 0; ki < kKinds.size(); ++ki) {
          const std::size_t at = 2 * (gi * kKinds.size() + ki);
          const double calls = all[r][static_cast<int64_t>(at)].item<double>() / static_cast<double>(steps);
          const double bytes = all[r][static_cast<int64_t>(at + 1)].item<double>() / static_cast<double>(steps);
          if (calls == 0) continue;
          tb.rows.push_back({{"name", fmt::format("{}/{}/{}", stage == 0 ? "first" : "last", kGroups[gi], kKinds[ki])},
                             {"calls", calls}, {"payload_bytes", static_cast<int64_t>(std::llround(bytes))}});
        }
      if (lay.pp == 1) break;
    }
    tb.notes.push_back("payload: the all-reduce's buffer, the all-gather's output, the reduce-scatter's input, the "
                       "tensor sent or received (dist::Group's counters); the DP all-reduces are the Reducer's gradient "
                       "bucket(s) and the loss's mean (8 B); the PP group's all-reduces, the executor's gathering of "
                       "every stage's gradients and events for the checks; the CP group's, the gradients' CP mean (one "
                       "bucket) and the loss's");
    return tb;
  }
};

/// Per step: max |θ_mesh − θ_(a)| (shard by shard), max |θ_mesh − θ_(b)| (the shards gathered over
/// the TP group) and max |θ_(b)|, each the worst rank's.
std::array<double, 3> compare_parameters(World& w, const Mesh& mesh, const MeshModels& mm) {
  double da = 0, db = 0, theta = 0;
  auto& tpg = *mesh.tp();
  for (std::size_t i = 0; i < mm.mesh_ps.size(); ++i) {
    da = nan_max(da, max_abs_diff64(mm.mesh_ps[i], mm.ref_ps[i]));
    const auto* spar = mm.sharded[i];
    auto shards = tp::all_gather_shards(mm.mesh_ps[i].detach(), tpg);
    torch::Tensor whole = spar->dim < 0 ? shards[0]
                                        : tp::unshard(shards, tp::all_gather_shards(spar->index, tpg), spar->dim,
                                                      mm.full_ps[i].size(spar->dim));
    db = nan_max(db, max_abs_diff64(whole, mm.full_ps[i]));
    theta = nan_max(theta, mm.full_ps[i].detach().abs().max().item<double>());
  }
  return {max_over_ranks(w, da), max_over_ranks(w, db), theta};
}

/// The training table: each SGD step of the mesh against the references (checks: (a) bitwise); then
/// the mesh's traffic per step (MeshComm).
void mesh_training_tables(const Config& cfg, World& w, const Mesh& mesh, Report& report) {
  const MeshLayout& lay = mesh.layout();
  const int dp = lay.dp, pp = lay.pp, m = static_cast<int>(cfg.integer("/mesh/microbatches"));
  const int64_t steps = cfg.integer("/mesh/steps"), b = cfg.integer("/data/batch");
  const double lr = cfg.number("/mesh/lr");
  MeshModels mm = build_mesh_models(cfg, mesh);
  std::unique_ptr<dist::Reducer> reducer;
  if (dp > 1) {
    dist::ReducerOptions ro;
    ro.overlap = false;        // the executor's backward runs with sync off; finalize() all-reduces
    ro.divide_before = false;  // sum, then ÷ dp
    reducer = std::make_unique<dist::Reducer>(mm.mesh_ps, mesh.dp(), ro);
    reducer->set_sync(false);
  }
  const auto sched = make_schedule(parse_schedule(cfg.str("/mesh/schedule")), pp, m);
  Table st{"mesh", fmt::format("GPT on the mesh dp {} x cp {} x tp {} x pp {} ({} microbatches, {}), parameters after "
                               "each SGD step vs the references", dp, lay.cp, lay.tp, pp, m, cfg.str("/mesh/schedule")),
           {text_col("name", "step"), float_col("loss", "mesh loss", "nats", 7), sci_col("loss_vs_one", "vs 1-proc"),
            sci_col("vs_tp_ref", "max|d theta| TP ref"), sci_col("bound", "bound"),
            sci_col("vs_one_process", "max|d theta| 1-proc"), sci_col("max_theta", "max|theta|")}};
  std::vector<double> mesh_losses;  // per step, for the divergence note
  MeshComm comm;
  for (int64_t k = 0; k < steps; ++k) {
    w.fault_point(k);
    w.note_progress();
    MeshComm::reset(mesh);
    const double loss_mesh = mesh_step(mesh, mm, reducer.get(), sched, m, b, lr);
    comm.add(mesh);
    const double loss1 = replay_references(mm, mesh.cp(), dp, pp, m, b, lr);
    const auto [da, db, theta] = compare_parameters(w, mesh, mm);
    const double loss_diff = max_over_ranks(w, std::abs(loss_mesh - loss1));
    st.rows.push_back({{"name", fmt::format("step{}", k + 1)}, {"loss", loss_mesh}, {"loss_vs_one", loss_diff},
                       {"vs_tp_ref", da}, {"bound", 0.0}, {"vs_one_process", db}, {"max_theta", theta}});
    report.check(fmt::format("mesh step {}: parameters bitwise equal to TP on {} rank(s){} without pipeline and DP "
                             "(same sums; dp, cp <= 2)", k + 1, lay.tp,
                             lay.cp > 1 ? fmt::format(" and CP ({}) on {}", cfg.str("/mesh/cp_attention"), lay.cp) : ""),
                 da, 0.0);
    mesh_losses.push_back(loss_mesh);
  }
  note_divergence(report, st, "mesh", mesh_losses, /*first_step=*/1);  // the rows count steps from 1
  st.notes.push_back("mesh loss: the global batch's mean loss before the step (the DP mean of each pipeline's "
                     "sum of loss_j / m); vs 1-proc: |mesh loss - the plain model's|");
  st.notes.push_back("TP ref: the same TP-sharded GPT on its TP group, no pipeline, no DP (all blocks in order, "
                     "every DP shard's microbatches, (G_0 + ... + G_dp-1) / dp, the same SGD): bound 0 — a stage cut "
                     "changes no arithmetic and a two-term all-reduce is a + b = b + a (checked for dp <= 2)");
  if (lay.cp > 1)
    st.notes.push_back(fmt::format("context parallelism ({} attention, {} split): the mesh and the TP ref run the same "
                                   "CP attention on the same CP group, each rank its positions of every sequence; "
                                   "the gradients' CP mean (one bucket summed over the CP group, / cp) follows the "
                                   "DP mean in both. Against one process the CP attention is bounded per operation "
                                   "(mpt contextparallel); here reported", cfg.str("/mesh/cp_attention"),
                                   cfg.str("/mesh/cp_split")));
  st.notes.push_back("1-proc: the plain TinyGpt (torch::linear, F.cross_entropy) on the same microbatches; the TP "
                     "shards gathered to full shape. Reported: TP's row-parallel partial sums and the vocab-parallel "
                     "cross-entropy round differently (each operation within its reordering bound: the TP "
                     "sections), and the differences propagate through the network and the steps");
  report.add(st);
  report.add(comm.table(w, mesh, steps));
}

}  // namespace

Report run_mesh(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  World& w = *ctx.world;
  const Mesh mesh(w, MeshLayout(static_cast<int>(cfg.integer("/mesh/dp")), static_cast<int>(cfg.integer("/mesh/tp")),
                                static_cast<int>(cfg.integer("/mesh/pp")), static_cast<int>(cfg.integer("/mesh/cp"))));
  const MeshLayout& lay = mesh.layout();
  report.env["mesh"] = lay.cp > 1 ? fmt::format("dp {} x cp {} x tp {} x pp {} ({} attention, {} split)", lay.dp, lay.cp,
                                                lay.tp, lay.pp, cfg.str("/mesh/cp_attention"), cfg.str("/mesh/cp_split"))
                                  : fmt::format("dp {} x tp {} x pp {}", lay.dp, lay.tp, lay.pp);
  report.add(mesh_layout_table(lay));
  mesh_training_tables(cfg, w, mesh, report);
  return report;
}

/// The mesh's cross-key checks (/mesh/steps > 0), before any worker starts.
void validate_mesh(const Config& cfg, int world_size) {
  const int64_t dp = cfg.integer("/mesh/dp"), tp = cfg.integer("/mesh/tp"), pp = cfg.integer("/mesh/pp"),
                cpd = cfg.integer("/mesh/cp");
  if (dp * tp * pp * cpd != world_size)
    throw ConfigError(fmt::format("/mesh: expected /mesh/dp x /mesh/cp x /mesh/tp x /mesh/pp = the world size {} (--nproc "
                                  "or the launcher's WORLD_SIZE), got {} x {} x {} x {} = {}",
                                  world_size, dp, cpd, tp, pp, dp * tp * pp * cpd));
  const int64_t a = cfg.integer("/model/heads"), h = cfg.integer("/model/width"), L = cfg.integer("/model/layers");
  if (h % a != 0)
    throw ConfigError(fmt::format("/model/heads: expected a divisor of /model/width = {}, got {}", h, a));
  if (a % tp != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of /model/heads = {} (every TP rank owns whole heads), "
                                  "got {}", a, tp));
  const int64_t mh = cfg.integer("/model/mlp_ratio") * h;
  if (mh % tp != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of the MLP width /model/mlp_ratio x /model/width = {}, "
                                  "got {}", mh, tp));
  if (pp > L || L % pp != 0)
    throw ConfigError(fmt::format("/mesh/pp: expected a divisor of /model/layers = {} (every stage holds L/pp blocks), "
                                  "got {}", L, pp));
  const int64_t m = cfg.integer("/mesh/microbatches"), b = cfg.integer("/data/batch");
  if (m < pp)
    throw ConfigError(fmt::format("/mesh/microbatches: expected at least /mesh/pp = {} (a pipeline of p stages needs "
                                  ">= p microbatches in flight), got {}", pp, m));
  if (b % m != 0)
    throw ConfigError(fmt::format("/mesh/microbatches: expected a divisor of /data/batch = {} (equal microbatches), "
                                  "got {}", b, m));
  const int64_t s = cfg.integer("/data/seq");
  if (s > cfg.integer("/model/context"))
    throw ConfigError(fmt::format("/data/seq: expected at most /model/context = {}, got {}", cfg.integer("/model/context"), s));
  if (cpd > 1) {
    const int64_t parts = cfg.str("/mesh/cp_split") == "balanced" ? 2 * cpd : cpd;
    if (s % parts != 0)
      throw ConfigError(fmt::format("/data/seq: expected a multiple of {} (the {} split over /mesh/cp = {}), got {}", parts,
                                    cfg.str("/mesh/cp_split"), cpd, s));
    if (cfg.str("/mesh/cp_attention") == "ulysses" && (a / tp) % cpd != 0)
      throw ConfigError(fmt::format("/mesh/cp: expected a divisor of the heads per TP rank /model/heads / /mesh/tp = {} "
                                    "(Ulysses gives every CP rank whole heads), got {}", a / tp, cpd));
  }
  const int64_t fault = cfg.integer("/fault/rank");
  if (fault >= world_size)
    throw ConfigError(fmt::format("/fault/rank: expected -1 or a rank 0 .. {}, got {}", world_size - 1, fault));
  if (fault >= 0 && cfg.integer("/fault/step") >= cfg.integer("/mesh/steps"))
    throw ConfigError(fmt::format("/fault/step: expected a step < /mesh/steps = {}, got {}", cfg.integer("/mesh/steps"),
                                  cfg.integer("/fault/step")));
}

}  // namespace mpt
