// mpt expertparallel, the mesh section (/mesh/steps > 0: this section alone) — the MoE GPT on a
// DP x TP mesh with expert parallelism carved out of DP (core/parallel/mesh's ep axis, as
// Megatron-core places it): each rank's attention and experts TP-sharded on its TP group
// (core/parallel/ep's TpMoeShards: expert tensor parallelism = TP), its E/ep experts reached by
// all-to-all on its EP group, its own sequences; the dense gradients summed over DP, the experts'
// over the expert-DP group; SGD. Checked after every step against the same TP model without DP
// and EP (every DP shard's sequences as groups, every expert on the TP group) — bit for bit where
// every sum across ranks has two terms (dp = ep <= 2: a + b = b + a) — and reported against one
// process without TP. See expertparallel.cpp.
#include <cmath>

#include <fmt/format.h>

#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/models/mlp.hpp"
#include "core/models/moe.hpp"
#include "core/parallel/ep.hpp"
#include "core/parallel/mesh.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt::epx {

/// expertparallel.cpp's: the MoE layer of the /moe keys with balancing `balance`.
moe::MoeConfig moe_config(const Config& cfg, const std::string& balance);

namespace {

/// One model of the mesh section: the full MoE GPT (its replicated modules used as they are), and
/// its TP shards where a TP group is given.
struct MeshModel {
  moe::MoeGpt full{nullptr};
  std::unique_ptr<ep::TpMoeShards> shards;
  std::vector<ep::TpLeaf> leaves;  // what SGD updates
};

MeshModel build_model(const Config& cfg, const GptConfig& gc, const std::shared_ptr<dist::Group>& tp, int64_t first,
                      int64_t count) {
  MeshModel m;
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  m.full = moe::MoeGpt(gc, moe_config(cfg, cfg.str("/mesh/balance")));
  if (tp) {
    m.shards = std::make_unique<ep::TpMoeShards>(*m.full, tp, first, count);
    m.leaves = m.shards->leaves();
  } else {
    for (const auto& kv : m.full->named_parameters())
      m.leaves.push_back({kv.key(), kv.value(), -1, {}, ep::is_expert_param(kv.key())});
  }
  return m;
}

/// One training step of `m` on `xs`/`ys` (its groups; `first_group` their place among the
/// `groups` of the batch): forward through `experts`, the loss (each group's token losses over
/// the batch's tokens plus its share of the Switch loss, the groups added in order), backward,
/// `reduce` on each leaf's gradient, SGD θ −= lr·g, the aux-free bias from the loads (`loads`
/// sums them over the ranks). Returns this model's loss (before `reduce`'s sums) and the loads.
std::pair<double, torch::Tensor> step(MeshModel& m, const std::vector<torch::Tensor>& xs, const std::vector<torch::Tensor>& ys,
                                      moe::Experts& experts, int64_t groups, double lr,
                                      const std::function<void(const ep::TpLeaf&, torch::Tensor&)>& reduce,
                                      const std::function<void(torch::Tensor&)>& loads_reduce) {
  for (auto& l : m.leaves) l.local.mutable_grad() = torch::Tensor();
  std::vector<moe::LayerRouting> routing;
  const auto logits = m.full->forward(xs, experts, &routing, m.shards ? m.shards->linear() : GptLinear{});
  torch::Tensor loss;
  for (std::size_t g = 0; g < xs.size(); ++g) {
    const int64_t total = ys[g].numel() * groups;
    auto lm = moe::group_lm_loss(logits[g], ys[g], total);
    auto lg = lm + m.full->aux_loss(static_cast<int64_t>(g), groups);
    loss = g == 0 ? lg : loss + lg;
  }
  loss.backward();
  {
    torch::NoGradGuard ng;
    for (auto& l : m.leaves) {
      auto g = l.local.grad();
      if (!g.defined()) continue;
      reduce(l, g);
      l.local.add_(g, -lr);
    }
  }
  std::vector<torch::Tensor> counts;
  for (const auto& lr_ : routing) counts.push_back(lr_.counts.sum(0));
  auto loads = torch::stack(counts).to(torch::kDouble);  // [L, E]
  loads_reduce(loads);
  m.full->update_bias(loads);
  return {loss.item<double>(), loads};
}

}  // namespace

Report run_expertparallel_mesh(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  World& w = *ctx.world;
  Report report;
  const int dp = static_cast<int>(cfg.integer("/mesh/dp")), tpd = static_cast<int>(cfg.integer("/mesh/tp")),
            epd = static_cast<int>(cfg.integer("/mesh/ep"));
  const MeshLayout layout(MeshDims{dp, tpd, 1, 1, epd});
  Mesh mesh(w, layout);
  const auto& c = mesh.coord();
  const TextCorpus corpus = load_text_corpus_at(cfg, "/data");
  const GptConfig gc = gpt_config_at(cfg, "/model", corpus.vocab());
  const int64_t E = cfg.integer("/moe/experts"), b = cfg.integer("/data/batch"), steps = cfg.integer("/mesh/steps");
  const double lr = cfg.number("/train/lr");
  report.env["mesh"] = {{"dp", dp}, {"tp", tpd}, {"ep", epd}};

  Table lt{"mesh_layout", fmt::format("Rank layout of the dp {} x tp {} mesh with ep {} carved out of dp (ranks in dp, "
                                      "tp order: tp fastest)", dp, tpd, epd),
           {int_col("rank", "rank"), int_col("dp", "dp"), int_col("tp", "tp"), int_col("ep", "ep index"),
            text_col("experts", "experts"), text_col("ep_group", "EP group"), text_col("edp_group", "expert-DP group")}};
  for (int r = 0; r < layout.size(); ++r) {
    const auto rc = layout.coord(r);
    const auto [first, count] = ep::local_experts(E, epd, rc.ep);
    auto join = [](const std::vector<int>& v) {
      std::string s;
      for (int x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
      return s;
    };
    lt.rows.push_back({{"rank", r}, {"dp", rc.dp}, {"tp", rc.tp}, {"ep", rc.ep},
                       {"experts", fmt::format("{}..{}", first, first + count - 1)},
                       {"ep_group", join(layout.ep_group(0, rc.dp, rc.tp))}, {"edp_group", join(layout.edp_group(0, rc.dp, rc.tp))}});
  }
  report.add(std::move(lt));

  // The mesh rank, the TP reference (all experts on the TP group, every DP shard's sequences as
  // groups) and one process without TP, each built from the seed.
  const auto [first, count] = ep::local_experts(E, epd, c.ep);
  MeshModel mine = build_model(cfg, gc, mesh.tp(), first, count);
  MeshModel ref = build_model(cfg, gc, mesh.tp(), 0, E);
  MeshModel one = build_model(cfg, gc, nullptr, 0, E);
  // ep = 1: every rank holds every expert (LocalExperts on its own tokens), no all-to-all.
  const std::shared_ptr<dist::Group> epg = epd > 1 ? mesh.group("ep") : nullptr;
  std::unique_ptr<moe::Experts> mine_experts;
  if (epg)
    mine_experts = std::make_unique<ep::ExpertParallel>(epg, mine.shards->expert_fn());
  else
    mine_experts = std::make_unique<moe::LocalExperts>(mine.shards->expert_fn());
  moe::LocalExperts ref_experts(ref.shards->expert_fn()), one_experts;
  // The experts' gradients: complete on their EP owner for its EP group's tokens; summed over the
  // expert-DP group (the ranks holding the same experts: the DP group when ep = 1, none when ep = dp).
  std::shared_ptr<dist::Group> edp;
  if (epd == 1 && dp > 1) edp = mesh.dp();
  else if (epd > 1 && epd < dp) edp = mesh.group("edp");
  // Bitwise where every sum across ranks has at most two terms and each expert runs one GEMM over
  // its EP group's rows, as the reference's over every group's (ep = dp).
  const bool bitwise = dp <= 2 && epd == dp;
  const std::string why_not = dp > 2 ? "reported: the dense gradients are sums of more than two parts across ranks"
                                     : "reported: an expert's gradient is dp/ep GEMMs summed over the expert-DP group, "
                                       "the reference's one GEMM over every group's rows";

  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(cfg.integer("/seed")));
  Table t{"mesh", fmt::format("MoE GPT (E = {}, top-{}, {}) on the dp {} x tp {} mesh, ep {}: every step against the same TP "
                              "model without DP and EP{}, and against one process without TP",
                              E, cfg.integer("/moe/top_k"), cfg.str("/mesh/balance"), dp, tpd, epd,
                              bitwise ? " (bitwise)" : " (" + why_not + ")"),
          {int_col("step", "step"), float_col("loss", "loss", "nats", 7), sci_col("vs_tp_reference", "params vs TP ref"),
           sci_col("loss_vs_one_process", "loss vs 1-proc"), float_col("imbalance", "imbalance", "", 3),
           int_col("a2a_sent", "all-to-all sent", "bytes"), int_col("a2a_formula", "formula", "bytes")}};
  for (int64_t s = 0; s < steps; ++s) {
    w.fault_point(s);
    auto [x, y] = text_batch(corpus.train, dp * b, gc.context, gen);
    const auto xs = x.chunk(dp), ys = y.chunk(dp);
    if (epg) epg->reset_comm_counts();
    const auto [my_loss, loads] = step(
        mine, {xs[static_cast<std::size_t>(c.dp)]}, {ys[static_cast<std::size_t>(c.dp)]}, *mine_experts, dp, lr,
        [&](const ep::TpLeaf& l, torch::Tensor& g) {
          if (!l.expert) mesh.dp()->allreduce(g);
          else if (edp) edp->allreduce(g);
        },
        [&](torch::Tensor& ld) { mesh.dp()->allreduce(ld); });
    const auto comm = epg ? epg->comm_counts() : std::map<std::string, dist::CommCount>{};
    const auto [ref_loss, ref_loads] = step(ref, xs, ys, ref_experts, dp, lr, [](const ep::TpLeaf&, torch::Tensor&) {},
                                            [](torch::Tensor&) {});
    const auto [one_loss, one_loads] = step(one, xs, ys, one_experts, dp, lr, [](const ep::TpLeaf&, torch::Tensor&) {},
                                            [](torch::Tensor&) {});
    auto l = torch::tensor({my_loss}, torch::kFloat);
    mesh.dp()->allreduce(l);
    const double mesh_loss = l.item<double>();
    // Parameters against the TP reference's leaf of the same name (this rank's shard).
    std::map<std::string, torch::Tensor> ref_leaves;
    for (const auto& rl : ref.leaves) ref_leaves[rl.name] = rl.local;
    double diff = std::abs(mesh_loss - ref_loss);
    for (const auto& ml : mine.leaves) diff = nan_max(diff, (ml.local - ref_leaves.at(ml.name)).abs().max().item<double>());
    auto dd = torch::tensor({diff}, torch::kFloat64);
    w.group()->allreduce(dd, dist::ReduceOp::Max);
    const int64_t cap = moe::capacity(b * gc.context, moe_config(cfg, cfg.str("/mesh/balance")));
    const auto it = comm.find("all_to_all");
    const double sent = it == comm.end() ? 0.0 : it->second.sent_bytes;
    const double formula = static_cast<double>(gc.layers) * ep::bytes_per_layer(epd, E, cap, gc.width);
    auto ld = loads.to(torch::kDouble);
    const double imb = (std::get<0>(ld.max(1)) / ld.mean(1)).max().item<double>();
    t.rows.push_back({{"step", s + 1}, {"loss", mesh_loss}, {"vs_tp_reference", dd.item<double>()},
                      {"loss_vs_one_process", std::abs(mesh_loss - one_loss)}, {"imbalance", imb},
                      {"a2a_sent", sent}, {"a2a_formula", formula}});
    if (bitwise)
      report.check(fmt::format("mesh step {}: loss and parameters bitwise equal to TP without DP and EP (max |diff|)", s + 1),
                   dd.item<double>(), 0.0);
    report.check(fmt::format("mesh step {}: all-to-all bytes sent on the EP group equal to the formula", s + 1),
                 std::abs(sent - formula), 0.0);
  }
  t.notes.push_back(bitwise ? "TP reference: the same TP shards on this rank's TP group, every DP shard's sequences as a "
                              "group and every expert held (no EP): the experts' GEMMs see the same rows, and each "
                              "dense gradient is the same dp parts added (a + b = b + a): bitwise"
                            : "TP reference: the same TP shards on this rank's TP group, every DP shard's sequences as a "
                              "group and every expert held (no EP); " + why_not);
  t.notes.push_back("one process: the plain MoE GPT, no TP (the row-parallel sums differ in the last bits: reported)");
  t.notes.push_back("all-to-all: the EP group's dispatch and combine per MoE layer, forward and backward, 4 (ep-1)/ep "
                    "E cap C 4 bytes; with tp > 1 every TP rank of an EP pair exchanges its own copy (no sequence "
                    "parallelism: its tokens are replicated over TP)");
  report.add(std::move(t));
  return report;
}

/// The mesh section's cross-key checks (exit 2 naming the key).
void validate_expertparallel_mesh(const Config& cfg, int world_size) {
  const int64_t dp = cfg.integer("/mesh/dp"), tpd = cfg.integer("/mesh/tp"), epd = cfg.integer("/mesh/ep");
  if (dp * tpd != world_size)
    throw ConfigError(fmt::format("/mesh/dp, /mesh/tp: expected dp x tp = the processes ({}), got {} x {} = {}",
                                  world_size, dp, tpd, dp * tpd));
  if (dp % epd != 0)
    throw ConfigError(fmt::format("/mesh/ep: expected a divisor of /mesh/dp = {} (EP groups are carved out of DP), got {}",
                                  dp, epd));
  const int64_t E = cfg.integer("/moe/experts");
  if (E % epd != 0) throw ConfigError(fmt::format("/moe/experts: expected a multiple of /mesh/ep = {}, got {}", epd, E));
  if (cfg.integer("/model/heads") % tpd != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of /model/heads = {}, got {}", cfg.integer("/model/heads"), tpd));
  const int64_t H = cfg.integer("/model/mlp_ratio") * cfg.integer("/model/width");
  if (H % tpd != 0)
    throw ConfigError(fmt::format("/mesh/tp: expected a divisor of the expert width /model/mlp_ratio x /model/width = "
                                  "{}, got {}", H, tpd));
  validate_fault_keys(cfg, world_size, cfg.integer("/mesh/steps"), "/mesh/steps");
}

}  // namespace mpt::epx
