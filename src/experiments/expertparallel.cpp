/*
 * mpt expertparallel — the tiny GPT with a mixture of experts in every block (core/models/moe),
 * its E experts sharded over e processes (c10d, Gloo on CPU) and reached by all-to-all
 * (core/parallel/ep), proven against one process holding every expert.
 *
 * Every rank holds a replica of the dense weights, E/e experts and its own sequences of the
 * batch (as data parallelism gives them). Each layer it routes its tokens (top-k of the router's
 * softmax, at most `capacity` tokens per expert, the rest dropped), sends each expert's buffer to
 * the expert's owner (all-to-all), runs its experts on every rank's tokens, and sends the outputs
 * back (all-to-all) to be weighted by the gates. One process runs the same groups (a rank's
 * sequences each) through the same operations, its experts on the same concatenated rows: the
 * same bits wherever no sum crosses ranks.
 *
 *  1. the MoE GPT vs one process, one step for each balancing method at the initial and at the
 *     trained weights: logits and expert gradients bitwise, routing and drops equal, the loss and
 *     the dense gradients (summed over ranks) within the bound of a reordered sum
 *  2. training with each balancing method — none, Switch's auxiliary loss, DeepSeek-V3's
 *     auxiliary-loss-free bias: tokens per expert, imbalance (max/mean) and dropped fraction per
 *     step, and the loss curve
 *  3. dropped-token fraction vs capacity factor, at the initial and the trained routers
 *  4. all-to-all bytes per step, counted by the process group, against the formula
 *
 *   mpt expertparallel                     # e = 2 processes
 *   mpt expertparallel --nproc 4
 *   torchrun --nproc_per_node 2 --no-python mpt expertparallel
 */
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/dist/dist.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/models/mlp.hpp"
#include "core/models/moe.hpp"
#include "core/numerics/bounds.hpp"
#include "core/parallel/ep.hpp"
#include "core/process_plan.hpp"
#include "core/runtime/runtime.hpp"

namespace mpt {

// A namespace of its own: the experiment files are compiled in unity batches.
namespace epx {

/// The MoE layer of the /moe keys with balancing `balance` (also the mesh section's).
moe::MoeConfig moe_config(const Config& cfg, const std::string& balance) {
  moe::MoeConfig m;
  m.experts = cfg.integer("/moe/experts");
  m.top_k = cfg.integer("/moe/top_k");
  m.capacity_factor = cfg.number("/moe/capacity_factor");
  m.balance = moe::balance_from_name(balance);
  m.aux_loss_coeff = cfg.number("/moe/aux_loss_coeff");
  m.bias_update_rate = cfg.number("/moe/bias_update_rate");
  return m;
}

Report run_expertparallel_mesh(const Context& ctx);           // expertparallel_mesh.cpp
void validate_expertparallel_mesh(const Config& cfg, int world_size);

namespace {

const char* const kBalances[] = {"none", "aux_loss", "aux_free"};

ConfigSpec expertparallel_spec() {
  ConfigSpec s;
  s.integer("/seed", 1, "seed before building each model (torch.manual_seed) and of the text batches", 0);
  s.integer("/nproc", 2, "worker processes (--nproc N): the EP degree e (must divide /moe/experts); ignored under "
            "torchrun/SLURM", 1, 8);
  add_gpt_keys(s, "/model", GptKeyDefaults{/*layers=*/2, /*width=*/64, /*heads=*/4, /*context=*/32, /*mlp_ratio=*/2});
  add_text_keys(s, "/data");
  s.integer("/data/batch", 4, "sequences per rank and step (each rank's group of the batch)", 1, 4096);
  s.integer("/moe/experts", 8, "experts E per block (e must divide them)", 1, 1024);
  s.integer("/moe/top_k", 2, "experts k each token is routed to (<= /moe/experts)", 1, 1024);
  Param cf;
  cf.type = ParamType::Number;
  cf.default_value = 1.25;
  cf.doc = "capacity factor: each expert takes at most ceil(N k cf / E) of a group's N tokens, the rest are dropped";
  cf.exclusive_min = 0.0;
  cf.max = 1e6;
  s.add("/moe/capacity_factor", cf);
  s.number("/moe/aux_loss_coeff", 0.01, "alpha of Switch's auxiliary loss (aux_loss)", 0.0, 1e3);
  s.number("/moe/bias_update_rate", 0.001, "gamma of DeepSeek-V3's bias update (aux_free)", 0.0, 1e3);
  s.strings("/moe/balances", {"none", "aux_loss", "aux_free"}, {"none", "aux_loss", "aux_free"},
            "the balancing methods trained and checked: none, aux_loss (Switch) and aux_free (DeepSeek-V3)");
  s.integer("/train/steps", 60, "training steps per balancing method", 1, 100000);
  s.number("/train/lr", 0.1, "SGD learning rate", 1e-9, 1e3);
  s.number("/train/momentum", 0.9, "SGD momentum (torch.optim.SGD)", 0.0, 0.999);
  Param cfs;
  cfs.type = ParamType::NumberList;
  cfs.default_value = std::vector<double>{0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 4.0};
  cfs.doc = "capacity factors of the dropped-token table (section 3)";
  cfs.exclusive_min = 0.0;
  cfs.max = 1e6;
  cfs.unique = true;
  s.add("/capacity/factors", cfs);
  s.integer("/mesh/steps", 0, "steps of the DP x TP mesh with EP inside DP (0: off; > 0: that section alone, "
            "/nproc = dp x tp; /moe/balances, /capacity/factors and /train/steps are then unused)", 0, 10000);
  s.integer("/mesh/dp", 2, "mesh: data-parallel degree", 1, 8);
  s.integer("/mesh/tp", 2, "mesh: tensor-parallel degree (attention heads and expert width split; expert TP = TP)", 1, 8);
  s.integer("/mesh/ep", 2, "mesh: expert-parallel degree, carved out of dp (must divide /mesh/dp)", 1, 8);
  s.choice("/mesh/balance", "aux_loss", {"none", "aux_loss", "aux_free"}, "mesh: the balancing method trained");
  add_dist_keys(s, DistKeys{"training step (counted over the balancing methods; the mesh: its steps)", 1, 7, false});
  return s;
}

/// The text batches: step s's global batch of e·b sequences drawn by text_batch (nanoGPT's
/// get_batch) from one generator seeded with /seed; group g (rank g) holds sequences g·b .. (g+1)·b − 1.
struct Batches {
  torch::Tensor x, y;  // [steps, e·b, T]
  int64_t groups = 1, per_group = 1;
  std::vector<torch::Tensor> inputs(int64_t step) const { return x[step].chunk(groups); }
  std::vector<torch::Tensor> targets(int64_t step) const { return y[step].chunk(groups); }
};

Batches draw_batches(const TextCorpus& corpus, int64_t steps, int64_t e, int64_t b, int64_t T, int64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(seed));
  std::vector<torch::Tensor> xs, ys;
  for (int64_t t = 0; t < steps; ++t) {
    auto [x, y] = text_batch(corpus.train, e * b, T, gen);
    xs.push_back(x);
    ys.push_back(y);
  }
  return {torch::stack(xs), torch::stack(ys), e, b};
}

/// The model of one balancing method, from the seed (every rank and the one-process reference draw
/// the same weights).
moe::MoeGpt build(const Config& cfg, const GptConfig& gc, const std::string& balance) {
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  return moe::MoeGpt(gc, moe_config(cfg, balance));
}

/// An expert-parallel rank's state of one method: its model (E/e experts), optimizer and group.
struct EpRun {
  moe::MoeGpt model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
};

/// One process's model with the EP ranks' current weights: the dense ones and the bias from this
/// rank (every rank holds the same), each expert's broadcast by its owner.
moe::MoeGpt gather_reference(const Config& cfg, const GptConfig& gc, const std::string& balance, moe::MoeGptImpl& ep_model,
                             dist::Group& g) {
  auto one = build(cfg, gc, balance);
  torch::NoGradGuard ng;
  const int64_t e = g.size(), E = ep_model.moe.experts;
  auto mine = ep_model.named_parameters();
  for (auto& kv : one->named_parameters())
    if (!ep::is_expert_param(kv.key())) kv.value().copy_(mine[kv.key()]);
  for (std::size_t l = 0; l < one->blocks.size(); ++l) {
    one->blocks[l]->mlp->expert_bias.copy_(ep_model.blocks[l]->mlp->expert_bias);
    for (int64_t i = 0; i < E; ++i) {
      const int owner = static_cast<int>(i / (E / e));
      auto dst = one->blocks[l]->mlp->experts[static_cast<std::size_t>(i)]->parameters();
      auto src = ep_model.blocks[l]->mlp->experts[static_cast<std::size_t>(i)]->parameters();
      for (std::size_t p = 0; p < dst.size(); ++p) {
        if (g.rank() == owner) dst[p].copy_(src[p]);
        g.broadcast(dst[p], owner);
      }
    }
  }
  return one;
}

/// The loss of a group (a rank's sequences; `g` its index in the model's last forward): its token
/// losses over the whole batch's token count plus its share of the Switch loss (the mean over the
/// `groups` of the batch); the groups' losses add up to the batch's.
torch::Tensor rank_loss(moe::MoeGptImpl& m, const torch::Tensor& logits, const torch::Tensor& targets, int64_t g,
                        int64_t groups) {
  const int64_t total = targets.numel() * groups;
  auto lm = moe::group_lm_loss(logits, targets, total);  // sequenced: the graph is built in one order
  auto aux = m.aux_loss(g, groups);
  return lm + aux;
}

// ----------------------------------------------------------------------------
// 1. The MoE GPT against one process
// ----------------------------------------------------------------------------

struct StepCheck {
  std::map<std::string, dist::CommCount> comm;  // the EP forward and backward
  int64_t capacity = 0;
};

/// One forward and backward of the EP model (its gradients zeroed before and after) and of one
/// process holding every expert with the same weights, on step `step`'s batch; rows into `t`.
StepCheck check_step(const Config& cfg, const GptConfig& gc, const std::string& balance, const std::string& when,
                     moe::MoeGptImpl& ep_model, const std::shared_ptr<dist::Group>& g, const Batches& data,
                     int64_t step, Table& t, Report& report) {
  const int64_t e = g->size(), r = g->rank();
  auto one = gather_reference(cfg, gc, balance, ep_model, *g);
  // One process: every group, all experts.
  moe::LocalExperts local;
  std::vector<moe::LayerRouting> one_routing;
  const auto xs = data.inputs(step), ys = data.targets(step);
  const auto one_logits = one->forward(xs, local, &one_routing);
  torch::Tensor one_loss;  // the groups' losses added in group order
  for (int64_t q = 0; q < e; ++q) {
    auto lq = rank_loss(*one, one_logits[static_cast<std::size_t>(q)], ys[static_cast<std::size_t>(q)], q, e);
    one_loss = q == 0 ? lq : one_loss + lq;
  }
  one_loss.backward();
  // Expert parallelism: this rank's group.
  ep::ExpertParallel experts(g);
  ep_model.zero_grad();
  g->reset_comm_counts();
  std::vector<moe::LayerRouting> routing;
  const auto logits = ep_model.forward({xs[static_cast<std::size_t>(r)]}, experts, &routing);
  auto loss = rank_loss(ep_model, logits[0], ys[static_cast<std::size_t>(r)], 0, e);
  loss.backward();
  StepCheck out;
  out.comm = g->comm_counts();
  out.capacity = routing.at(0).capacity;
  const double my_loss = loss.item<double>();
  auto losses = torch::tensor({my_loss}, torch::kFloat);
  g->allreduce(losses);
  const double ep_loss = losses.item<double>();
  const double abs_losses = [&] {
    auto a = torch::tensor({std::abs(my_loss)}, torch::kFloat64);
    g->allreduce(a);
    return a.item<double>();
  }();
  std::map<std::string, torch::Tensor> abs_sum;
  ep::allreduce_dense_grads(ep_model, *g, &abs_sum);

  const double logits_diff = dist::max_over(*g, max_abs_diff64(logits[0], one_logits[static_cast<std::size_t>(r)]));
  int64_t routing_diff = 0, dropped = 0, choices = 0;
  for (std::size_t l = 0; l < routing.size(); ++l) {
    routing_diff += (routing[l].counts[0] - one_routing[l].counts[r]).abs().sum().item<int64_t>() +
                    (routing[l].kept[0] - one_routing[l].kept[r]).abs().sum().item<int64_t>();
    dropped += (one_routing[l].counts - one_routing[l].kept).sum().item<int64_t>();
    choices += one_routing[l].counts.sum().item<int64_t>();
  }
  routing_diff = static_cast<int64_t>(dist::max_over(*g, static_cast<double>(routing_diff)));
  double expert_diff = 0, dense_ratio = 0, dense_diff = 0;
  const double u = bounds::kFp32UnitRoundoff;
  // Σ|part| itself is an fp32 sum of e terms (an all-reduce), at least (1 − γ_{e−1}) of the exact one.
  const double gam = 2 * bounds::gamma(e - 1, u) / (1 - bounds::gamma(e - 1, u));
  auto ep_params = ep_model.named_parameters();
  for (const auto& kv : one->named_parameters()) {
    const auto& p = ep_params[kv.key()];
    if (ep::is_expert_param(kv.key())) {
      if (p.numel() > 0) expert_diff = nan_max(expert_diff, max_abs_diff64(p.grad(), kv.value().grad()));
      continue;
    }
    auto d = (p.grad().to(torch::kDouble) - kv.value().grad().to(torch::kDouble)).abs();
    auto bound = abs_sum.at(kv.key()).to(torch::kDouble) * gam;
    auto ratio = torch::where(bound > 0, d / bound, torch::where(d > 0, torch::full_like(d, INFINITY), torch::zeros_like(d)));
    // where() sends a NaN bound or difference to a branch that hides it: a NaN anywhere fails.
    const bool nan = d.isnan().any().item<bool>() || bound.isnan().any().item<bool>();
    dense_ratio = nan_max(dense_ratio, nan ? NAN : ratio.max().item<double>());
    dense_diff = nan_max(dense_diff, d.max().item<double>());
  }
  expert_diff = dist::max_over(*g, expert_diff);
  dense_ratio = dist::max_over(*g, dense_ratio);
  dense_diff = dist::max_over(*g, dense_diff);
  // Two sums of the same e rank losses in different orders (the all-reduce's, one process's in
  // group order): each within γ_{e−1}·Σ|loss_r| of the exact sum.
  const double loss_bound = gam * abs_losses;
  const double loss_diff = std::abs(ep_loss - one_loss.item<double>());
  const std::string name = balance + "/" + when;
  t.rows.push_back({{"name", name}, {"loss", ep_loss}, {"loss_diff", loss_diff}, {"loss_bound", loss_bound},
                    {"logits_diff", logits_diff}, {"routing_diff", routing_diff},
                    {"dropped", static_cast<double>(dropped) / static_cast<double>(choices)},
                    {"expert_grad_diff", expert_diff}, {"dense_grad_diff", dense_diff}, {"dense_grad_ratio", dense_ratio}});
  report.check(name + ": logits bitwise equal to one process (max |diff|)", logits_diff, 0.0);
  report.check(name + ": tokens per expert and kept tokens equal to one process's, every group and layer", 
               static_cast<double>(routing_diff), 0.0);
  report.check(name + ": expert gradients bitwise equal to one process (max |diff|)", expert_diff, 0.0);
  report.check(name + ": dense gradients within 2 gamma_(e-1) sum|rank parts| of one process's (max err/bound)",
               dense_ratio, 1.0);
  report.check(name + ": loss within 2 gamma_(e-1) sum|rank losses| of one process's (|diff| / bound)",
               std::isnan(loss_diff) || std::isnan(loss_bound) ? NAN
               : loss_bound > 0                             ? loss_diff / loss_bound
               : loss_diff > 0                              ? INFINITY
                                                            : 0.0,
               1.0);
  ep_model.zero_grad();
  return out;
}

Table check_table(const Config& cfg, const GptConfig& gc, int64_t e) {
  return Table{"vs_one_process",
               fmt::format("MoE GPT (V = {}, C = {}, {} layer{}, E = {}, top-{}, capacity factor {}) on e = {}: one "
                           "step vs one process holding every expert, at the initial and at the trained weights",
                           gc.vocab, gc.width, gc.layers, gc.layers == 1 ? "" : "s", cfg.integer("/moe/experts"),
                           cfg.integer("/moe/top_k"), cfg.number("/moe/capacity_factor"), e),
               {text_col("name", "method/weights"), float_col("loss", "loss", "nats", 7), sci_col("loss_diff", "loss diff"),
                sci_col("loss_bound", "loss bound"), sci_col("logits_diff", "logits diff"),
                int_col("routing_diff", "routing diff"), float_col("dropped", "dropped", "", 4),
                sci_col("expert_grad_diff", "expert grad diff"), sci_col("dense_grad_diff", "dense grad diff"),
                float_col("dense_grad_ratio", "dense err/bound")}};
}

// ----------------------------------------------------------------------------
// 2. Training with each balancing method
// ----------------------------------------------------------------------------

struct Curve {
  std::vector<double> loss, imbalance, dropped;
  std::vector<torch::Tensor> loads;  // per step [L, E] int64, every rank's tokens
};

/// Imbalance of loads [L, E]: the largest over the layers of max_i load_i / mean load.
double imbalance(const torch::Tensor& loads) {
  auto l = loads.to(torch::kDouble);
  return (std::get<0>(l.max(1)) / l.mean(1)).max().item<double>();
}

/// Trains the EP model of `balance` for /train/steps steps (SGD with momentum; the dense
/// gradients all-reduced, the experts' complete on their owners; aux_free's bias stepped from the
/// batch's loads).
Curve train(const Config& cfg, EpRun& run, const std::shared_ptr<dist::Group>& g, World& w, const Batches& data,
            int64_t& fault_step) {
  const int64_t steps = cfg.integer("/train/steps"), e = g->size(), r = g->rank();
  ep::ExpertParallel experts(g);
  Curve c;
  for (int64_t s = 0; s < steps; ++s) {
    w.fault_point(fault_step++);
    run.opt->zero_grad();
    std::vector<moe::LayerRouting> routing;
    const auto logits = run.model->forward({data.inputs(s)[static_cast<std::size_t>(r)]}, experts, &routing);
    auto loss = rank_loss(*run.model, logits[0], data.targets(s)[static_cast<std::size_t>(r)], 0, e);
    loss.backward();
    ep::allreduce_dense_grads(*run.model, *g);
    run.opt->step();
    std::vector<torch::Tensor> counts, kept;
    for (const auto& lr : routing) {
      counts.push_back(lr.counts[0]);
      kept.push_back(lr.kept[0]);
    }
    auto stats = torch::stack({torch::stack(counts), torch::stack(kept)}).to(torch::kDouble);  // [2, L, E]
    g->allreduce(stats);
    run.model->update_bias(stats[0]);
    auto l = loss.detach().to(torch::kDouble).reshape({1});
    g->allreduce(l);
    c.loss.push_back(l.item<double>());
    c.loads.push_back(stats[0].to(torch::kLong));
    c.imbalance.push_back(imbalance(stats[0]));
    c.dropped.push_back(((stats[0] - stats[1]).sum() / stats[0].sum()).item<double>());
  }
  return c;
}

double mean_last(const std::vector<double>& x, std::size_t n) {
  n = std::min(n, x.size());
  double s = 0;
  for (std::size_t i = x.size() - n; i < x.size(); ++i) s += x[i];
  return s / static_cast<double>(n);
}

// ----------------------------------------------------------------------------
// 3. Dropped tokens vs capacity factor
// ----------------------------------------------------------------------------

/// The dropped fraction of every rank's tokens of `step`'s batch through `model` (no gradient) with
/// capacity factor `cf`: Σ (chose − kept) / Σ chose over the layers and ranks.
double dropped_fraction(moe::MoeGptImpl& model, double cf, const std::shared_ptr<dist::Group>& g, const Batches& data,
                        int64_t step) {
  torch::NoGradGuard ng;
  const double saved = model.moe.capacity_factor;
  model.moe.capacity_factor = cf;
  ep::ExpertParallel experts(g);
  std::vector<moe::LayerRouting> routing;
  model.forward({data.inputs(step)[static_cast<std::size_t>(g->rank())]}, experts, &routing);
  model.moe.capacity_factor = saved;
  auto s = torch::zeros({2}, torch::kFloat64);
  for (const auto& lr : routing) {
    s[0] += (lr.counts - lr.kept).sum().item<double>();
    s[1] += lr.counts.sum().item<double>();
  }
  g->allreduce(s);
  return (s[0] / s[1]).item<double>();
}

Report run_expertparallel(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  if (cfg.integer("/mesh/steps") > 0) return run_expertparallel_mesh(ctx);
  Report report;
  World& w = *ctx.world;
  auto g = w.new_group("ep/", w.size(), torch::kCPU);
  const int64_t e = g->size(), b = cfg.integer("/data/batch"), steps = cfg.integer("/train/steps");
  report.env["ep_degree"] = e;
  const TextCorpus corpus = load_text_corpus_at(cfg, "/data");
  const GptConfig gc = gpt_config_at(cfg, "/model", corpus.vocab());
  const Batches data = draw_batches(corpus, steps, e, b, gc.context, cfg.integer("/seed"));
  const auto balances = cfg.strings("/moe/balances");
  const int64_t E = cfg.integer("/moe/experts"), L = gc.layers;

  Table checks = check_table(cfg, gc, e);
  const std::string last = fmt::format("last {}", std::min<int64_t>(10, steps));  // the mean of the last steps
  Table balance{"balance",
                fmt::format("Training {} step{} on e = {} ({} sequences of {} tokens per rank): imbalance = max/mean "
                            "tokens per expert (the worst layer), dropped = fraction of the token choices over "
                            "capacity", steps, steps == 1 ? "" : "s", e, b, gc.context),
                {text_col("name", "method"), float_col("imbalance_first", "imbalance step 1", "", 3),
                 float_col("imbalance_last", "imbalance " + last, "", 3), float_col("dropped_first", "dropped step 1", "", 4),
                 float_col("dropped_last", "dropped " + last, "", 4), float_col("loss_first", "loss step 1", "nats", 4),
                 float_col("loss_last", "loss " + last, "nats", 4)}};
  std::vector<Column> expert_cols = {text_col("name", "method/layer")};
  for (int64_t i = 0; i < E; ++i) expert_cols.push_back(int_col("e" + std::to_string(i), "e" + std::to_string(i)));
  expert_cols.push_back(int_col("capacity", "capacity x e"));
  Table tokens{"tokens_per_expert",
               fmt::format("Tokens per expert at the last step (every rank's; {} tokens x top-{} choices per layer)",
                           e * b * gc.context, cfg.integer("/moe/top_k")),
               expert_cols};
  std::vector<Column> curve_cols = {int_col("step", "step")};
  for (const auto& m : balances) curve_cols.push_back(float_col(m, m, "nats", 4));
  Table curve{"loss_curve", "Training loss per step (the batch's mean token loss plus the auxiliary loss where used)",
              curve_cols};
  std::vector<Column> cf_cols = {float_col("capacity_factor", "capacity factor", "", 3), int_col("capacity", "capacity")};
  cf_cols.push_back(float_col("initial", "initial router", "", 4));
  for (const auto& m : balances) cf_cols.push_back(float_col(m, "trained " + m, "", 4));
  Table drops{"dropped_vs_capacity",
              fmt::format("Dropped fraction of the token choices vs capacity factor (the first batch; capacity = "
                          "min(N, ceil(N k cf / E)), at least 1; N = {} tokens per rank)", b * gc.context),
              cf_cols};

  std::map<std::string, Curve> curves;
  std::map<std::string, EpRun> runs;
  StepCheck first;
  int64_t fault_step = 0;
  for (const auto& m : balances) {
    EpRun run;
    run.model = build(cfg, gc, m);
    ep::drop_remote_experts(*run.model, e, g->rank());
    run.opt = std::make_unique<torch::optim::SGD>(
        run.model->parameters(), torch::optim::SGDOptions(cfg.number("/train/lr")).momentum(cfg.number("/train/momentum")));
    const auto sc = check_step(cfg, gc, m, "initial", *run.model, g, data, 0, checks, report);  // 1
    if (m == balances.front()) first = sc;
    curves[m] = train(cfg, run, g, w, data, fault_step);  // 2
    check_step(cfg, gc, m, "trained", *run.model, g, data, steps - 1, checks, report);
    runs[m] = std::move(run);
  }
  checks.notes.push_back("each rank's group runs the dense part with one process's shapes for that group, and each "
                         "expert runs once on every rank's buffer rows in rank order, as one process runs it: logits, "
                         "routing and expert gradients are the same bits; a dense gradient is the sum of the e "
                         "ranks' parts (all-reduced; one process's autograd adds the same parts in its order), so two "
                         "sums of the same terms: within 2 gamma_(e-1) sum|part| of each other, as the loss");
  checks.notes.push_back("trained: after the training of section 2, one process given the EP ranks' weights (the "
                         "experts from their owners), on the last training batch");

  for (const auto& m : balances) {
    const Curve& c = curves[m];
    json loads = json::array();
    for (const auto& l : c.loads) {
      json per_layer = json::array();
      for (int64_t i = 0; i < L; ++i) {
        auto row = l[i].contiguous();
        per_layer.push_back(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + E));
      }
      loads.push_back(per_layer);
    }
    balance.rows.push_back({{"name", m}, {"imbalance_first", c.imbalance.front()},
                            {"imbalance_last", mean_last(c.imbalance, 10)}, {"dropped_first", c.dropped.front()},
                            {"dropped_last", mean_last(c.dropped, 10)}, {"loss_first", c.loss.front()},
                            {"loss_last", mean_last(c.loss, 10)}, {"imbalance", c.imbalance}, {"dropped", c.dropped},
                            {"loss", c.loss}, {"loads", loads}});
    for (int64_t i = 0; i < L; ++i) {
      json row{{"name", m + "/h" + std::to_string(i)}, {"capacity", e * moe::capacity(b * gc.context, moe_config(cfg, m))}};
      for (int64_t x = 0; x < E; ++x) row["e" + std::to_string(x)] = c.loads.back()[i][x].item<int64_t>();
      tokens.rows.push_back(row);
    }
  }
  const int64_t every = std::max<int64_t>(1, steps / 10);
  for (int64_t s = 0; s < steps; s += every) {
    json row{{"step", s + 1}};
    for (const auto& m : balances) row[m] = curves[m].loss[static_cast<std::size_t>(s)];
    curve.rows.push_back(row);
  }
  if ((steps - 1) % every != 0) {
    json row{{"step", steps}};
    for (const auto& m : balances) row[m] = curves[m].loss.back();
    curve.rows.push_back(row);
  }
  balance.notes.push_back("none: the router learns from the loss alone, and the tokens crowd onto a few experts "
                          "(router collapse); aux_loss: Switch's alpha E sum f_i P_i pulls the mean probabilities "
                          "towards the loads' mean; aux_free: DeepSeek-V3's bias b_i += gamma sign(mean - load_i) "
                          "shifts the choice only, the gates stay the router's");
  balance.notes.push_back("per step in the result file: imbalance, dropped, loss and loads [step][layer][expert]");

  // 3. Dropped fraction vs capacity factor: the initial router (a fresh model) and each trained one.
  auto fresh = build(cfg, gc, balances.front());
  ep::drop_remote_experts(*fresh, e, g->rank());
  moe::MoeConfig mc = moe_config(cfg, balances.front());
  for (const double cf : cfg.numbers("/capacity/factors")) {
    mc.capacity_factor = cf;
    json row{{"capacity_factor", cf}, {"capacity", moe::capacity(b * gc.context, mc)},
            {"initial", dropped_fraction(*fresh, cf, g, data, 0)}};
    for (const auto& m : balances) row[m] = dropped_fraction(*runs[m].model, cf, g, data, 0);
    drops.rows.push_back(row);
  }
  drops.notes.push_back("a token over its expert's capacity skips the MoE (the block's residual carries it): cf >= "
                        "E/k never drops; below 1 some always are; imbalance raises the fraction at every cf");

  // 4. All-to-all bytes per step (the first check step: forward and backward).
  Table comm{"comm",
             fmt::format("Bytes one rank sends per step in the all-to-alls (forward + backward of {} MoE layer{}; "
                         "buffer E x capacity x C x 4 = {} x {} x {} x 4 bytes)",
                         L, L == 1 ? "" : "s", E, first.capacity, gc.width),
             {text_col("name", "collective"), int_col("calls", "calls"), int_col("sent", "sent", "bytes"),
              int_col("formula", "formula", "bytes"), int_col("payload", "payload", "bytes"),
              int_col("payload_formula", "payload formula", "bytes")}};
  {
    const auto it = first.comm.find("all_to_all");
    const dist::CommCount cc = it == first.comm.end() ? dist::CommCount{} : it->second;
    const double formula = static_cast<double>(L) * ep::bytes_per_layer(e, E, first.capacity, gc.width);
    const double payload = static_cast<double>(L) * ep::payload_per_layer(e, E, first.capacity, gc.width);
    // The expert weights this rank holds (the others' released), as `mpt plan` counts them per device.
    double held = 0;
    for (const auto& kv : runs[balances.front()].model->named_parameters())
      if (ep::is_expert_param(kv.key())) held += static_cast<double>(kv.value().numel() * kv.value().element_size());
    comm.rows.push_back({{"name", "all_to_all"}, {"calls", cc.calls}, {"sent", cc.sent_bytes}, {"formula", formula},
                         {"payload", static_cast<double>(cc.payload_bytes)}, {"payload_formula", payload},
                         {"expert_weight_bytes", held}, {"capacity", first.capacity}});
    report.check("all-to-all bytes sent per step equal to the formula 4 L (e-1)/e E cap C 4", std::abs(cc.sent_bytes - formula), 0.0);
    report.check("all-to-all payload per step equal to the formula 4 L E cap C 4",
                 std::abs(static_cast<double>(cc.payload_bytes) - payload), 0.0);
  }
  comm.notes.push_back("in the result file: the expert weight bytes this rank holds (E/e experts of every layer) and "
                       "the capacity per expert and rank");
  comm.notes.push_back("per layer: dispatch and combine forward, their gradients backward, each an all-to-all of the "
                       "capacity-padded [E, cap, C] buffer, of which (e-1)/e leaves the rank; the padding travels "
                       "too (Megatron-core's dropless dispatcher sends the counts first and no padding)");
  report.add(std::move(checks));
  report.add(std::move(balance));
  report.add(std::move(tokens));
  report.add(std::move(curve));
  report.add(std::move(drops));
  report.add(std::move(comm));
  return report;
}

MemoryEstimate expertparallel_memory(const Config& cfg, int world_size) {
  GptConfig c;
  c.vocab = 256;  // at most a byte's worth of characters
  c.context = cfg.integer("/model/context");
  c.width = cfg.integer("/model/width");
  c.layers = cfg.integer("/model/layers");
  c.mlp_ratio = cfg.integer("/model/mlp_ratio");
  const int64_t E = cfg.integer("/moe/experts");
  const double P = static_cast<double>(moe::moe_gpt_num_params(c, E));
  MemoryEstimate e;
  e.add("MoE GPT parameters, gradients and momentum (training and one-process reference)", "/model/*, /moe/experts",
        4 * 4 * P);
  const double T = static_cast<double>(c.context), B = static_cast<double>(cfg.integer("/data/batch")) * world_size,
               C = static_cast<double>(c.width), L = static_cast<double>(c.layers), k = cfg.integer("/moe/top_k");
  e.add("activations of the one-process reference (every rank's tokens)", "/data/batch, /model/*, /moe/*",
        4 * L * T * B * (64 * C + 8 * static_cast<double>(cfg.integer("/model/heads")) * T + 8 * k * C * c.mlp_ratio));
  e.add("text batches", "/train/steps, /data/batch", 16 * static_cast<double>(cfg.integer("/train/steps")) * B * T);
  e.times(world_size, "processes (/nproc)");
  return e;
}

/// Cross-key checks before any work and any worker (exit 2 naming the keys).
void validate_expertparallel(const Config& cfg, int world_size) {
  validate_gpt_keys(cfg, "/model", "/data", /*validation_windows=*/false);
  if (cfg.integer("/mesh/steps") > 0) {
    if (cfg.integer("/moe/top_k") > cfg.integer("/moe/experts"))
      throw ConfigError(fmt::format("/moe/top_k: expected at most /moe/experts = {}, got {}", cfg.integer("/moe/experts"),
                                    cfg.integer("/moe/top_k")));
    validate_expertparallel_mesh(cfg, world_size);
    return;
  }
  const int64_t E = cfg.integer("/moe/experts"), k = cfg.integer("/moe/top_k");
  if (E % world_size != 0)
    throw ConfigError(fmt::format("/moe/experts: expected a multiple of the EP degree e = {} (/nproc: every rank holds "
                                  "E/e experts), got {}", world_size, E));
  if (k > E) throw ConfigError(fmt::format("/moe/top_k: expected at most /moe/experts = {}, got {}", E, k));
  validate_fault_keys(cfg, world_size,
                      cfg.integer("/train/steps") * static_cast<int64_t>(cfg.strings("/moe/balances").size()),
                      "/train/steps x the methods of /moe/balances");
}

}  // namespace

}  // namespace epx

Experiment expertparallel_experiment() {
  using namespace epx;
  return {"expertparallel",
          "Expert parallelism: a mixture-of-experts GPT with top-k routing, capacity and drops, its experts over "
          "all-to-all, exact against one process; Switch's aux loss vs DeepSeek-V3's aux-free bias over training",
          expertparallel_spec, run_expertparallel, validate_expertparallel, expertparallel_memory, Processes::Multi,
          dist_fault_plan};
}

}  // namespace mpt
