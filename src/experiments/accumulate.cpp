/*
 * mpt accumulate — a big batch in time: gradient accumulation over micro-batches.
 *
 * The gradient of a mean loss over a batch of B samples is the sum over any split of
 * the batch into micro-batches of (sum of the micro-batch's per-sample losses) / B:
 *     g = ∇ (1/B) Σ_i ℓ_i = Σ_m ∇ (1/B) Σ_{i∈m} ℓ_i ,
 * so k backward passes on micro-batches, gradients summed in .grad, then one optimizer
 * step equal one step on the big batch — up to floating-point roundoff. Only the
 * normalisation must use the global count B (or the global token count), and layers
 * that look across the batch (BatchNorm) break the identity.
 *
 * Tables:
 *  1. gradients: max |g_accum − g_full| for k micro-batches of B/k (MLP on Fashion-MNIST).
 *  2. training:  S SGD steps with batch B, once as one batch and once as k micro-batches:
 *                the two loss curves side by side, and the largest parameter difference.
 *  3. normalisation: the pitfalls. (a) 65 samples in 3 micro-batches of 22/22/21:
 *                mean-per-micro-batch / k vs (sum of losses) / N. (b) padded sequences, each
 *                with its own number of valid tokens: mean-of-token-means / k (what Hugging
 *                Face transformers did before its 2024 fix), per-sequence means, and
 *                (sum of token losses) / (valid tokens in the whole batch) — only the last
 *                equals the full-batch token-mean gradient.
 *  4. batchnorm: the same comparison with a BatchNorm1d layer (statistics per micro-batch:
 *                not the big batch) and without it.
 *  5. memory:    peak bytes of one accumulated step for micro-batches B, B/2, B/4, ...:
 *                activations shrink with the micro-batch; parameters and gradients do not.
 *                Step times go to timings.
 *
 *   mpt accumulate
 *   mpt accumulate --set train.steps=100 --set train.micro_batches=8
 */
#include <cmath>

#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/runtime/timing.hpp"
#include "core/runtime/memory.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"

namespace mpt {

namespace {

namespace F = torch::nn::functional;

ConfigSpec accumulate_spec() {
  ConfigSpec s;
  s.string("/data/dir", kFashionMnistDir, "folder with Fashion-MNIST's train-*-idx*-ubyte.gz files");
  s.integer("/data/samples", 2048, "training samples loaded (the first ones of the train split)", 1, 60000);
  s.integer("/model/hidden", 128, "hidden units of the MLP 784 -> hidden -> 10", 1, 1 << 16);
  s.integer("/batch", 64, "global batch B (samples per optimizer step)", 1, 60000);
  s.integers("/micro_batches", {1, 2, 4, 8}, "micro-batch counts k compared in the gradients table", 1, 60000);
  s.integer("/train/steps", 20, "SGD steps S of the training comparison", 1, 100000);
  s.number("/train/lr", 0.1, "SGD learning rate", 0.0);
  s.integer("/train/micro_batches", 4, "micro-batches k of the accumulated training run", 1, 60000);
  s.number("/tolerance", 1e-5, "largest max abs difference accepted for the equivalences (fp32 roundoff)", 0.0);
  s.integer("/unequal/samples", 65, "samples of the unequal split (a)", 1, 60000);
  s.integer("/unequal/micro_batches", 3, "micro-batches of the unequal split (a)", 1, 60000);
  s.integer("/tokens/sequences", 32, "padded sequences of the masked-token case (b)", 1, 1 << 20);
  s.integer("/tokens/max_len", 16, "tokens per sequence incl. padding; valid lengths drawn in [1, max_len]", 1, 4096);
  s.integer("/tokens/micro_batches", 4, "micro-batches (of sequences) in case (b)", 1, 1 << 20);
  s.integer("/tokens/dim", 16, "token feature size (randn features, per-token MLP)", 1, 4096);
  s.integer("/tokens/classes", 8, "token classes (cross-entropy per token)", 2, 4096);
  s.integer("/batchnorm/micro_batches", 4, "micro-batches of the BatchNorm comparison", 1, 60000);
  s.integer("/memory/batch", 512, "global batch of the memory table", 1, 60000);
  s.integer("/memory/hidden", 128, "hidden units of the memory table's MLP 784 -> h -> h -> 10", 1, 1 << 16);
  s.integers("/memory/micro_batches", {1, 2, 4, 8}, "micro-batch counts k of the memory table", 1, 60000);
  s.integer("/timing/repeats", 2, "timed steps per memory row (median in timings)", 1, 1000);
  s.distinct("/micro_batches");  // each names a row
  s.distinct("/memory/micro_batches");  // each names a row
  return s;
}

// ----------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------

/// MLP 784 → hidden [→ hidden2] → 10 (BatchNorm1d after each hidden Linear when `batchnorm`),
/// built from `seed` (core/models/mlp' mlp).
torch::nn::Sequential mlp(int64_t hidden, bool batchnorm, std::uint64_t seed, int64_t hidden2 = 0) {
  seed_all(seed);
  std::vector<int64_t> widths{hidden};
  if (hidden2 > 0) widths.push_back(hidden2);
  return mpt::mlp(784, widths, 10, batchnorm);
}

/// Micro-batch [begin, end) ranges of n samples in k parts, as torch.tensor_split: the first
/// n mod k parts get one sample more.
std::vector<std::pair<int64_t, int64_t>> split_ranges(int64_t n, int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> r;
  int64_t b = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t len = n / k + (i < n % k ? 1 : 0);
    r.emplace_back(b, b + len);
    b += len;
  }
  return r;
}

/// "22/22/21" for a few micro-batches; "8x16" for many equal ones.
std::string sizes_text(const std::vector<std::pair<int64_t, int64_t>>& r) {
  if (r.size() > 4 && r.front().second - r.front().first == r.back().second - r.back().first)
    return fmt::format("{}x{}", r.size(), r.front().second - r.front().first);
  std::string s;
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? "/" : "") + std::to_string(r[i].second - r[i].first);
  return s;
}

double max_abs(const std::vector<torch::Tensor>& a) {
  double d = 0;
  for (const auto& t : a) d = nan_max(d, t.abs().max().item<double>());  // a NaN stays (std::max drops it)
  return d;
}

/// Full-batch gradient of the mean cross-entropy over (x, y).
std::vector<torch::Tensor> full_grad(torch::nn::Sequential& net, const torch::Tensor& x, const torch::Tensor& y) {
  zero_grads(net->parameters());
  F::cross_entropy(net->forward(x), y).backward();
  return clone_grads(net->parameters());
}

/// Accumulated gradient over k micro-batches, each loss = mean over the micro-batch ×
/// (micro-batch size / B) — equal to mean/k for equal micro-batches. Returns the summed loss.
double accumulate_grad(torch::nn::Sequential& net, const torch::Tensor& x, const torch::Tensor& y, int64_t k) {
  const int64_t n = x.size(0);
  double loss_sum = 0;
  for (auto [b, e] : split_ranges(n, k)) {
    auto loss = F::cross_entropy(net->forward(x.slice(0, b, e)), y.slice(0, b, e)) *
                (static_cast<double>(e - b) / static_cast<double>(n));
    loss.backward();
    loss_sum += loss.item<double>();
  }
  return loss_sum;
}

/// Throws ConfigError unless 1 <= k <= n.
void check_split(const std::string& ptr, int64_t k, const std::string& what, int64_t n) {
  if (k > n)
    throw ConfigError(fmt::format("{}: expected at most {} micro-batches (at least one sample each), got {}", ptr,
                                  what + " = " + std::to_string(n), k));
}

// ----------------------------------------------------------------------------
// 1. Gradients: one batch vs k micro-batches
// ----------------------------------------------------------------------------
Table gradients_table(const Dataset& d, int64_t hidden, int64_t batch, const std::vector<long long>& ks,
                      std::uint64_t seed, torch::Device dev, double tol, Report& report) {
  auto net = mlp(hidden, false, seed);
  net->to(dev);
  auto x = d.images.slice(0, 0, batch).to(dev), y = d.labels.slice(0, 0, batch).to(dev);
  auto g_full = full_grad(net, x, y);
  Table t{"gradients", fmt::format("Gradients: one batch of {} vs k micro-batches, losses scaled by size/B and summed", batch),
          {text_col("name", "k"), int_col("micro_batches", "k"), text_col("sizes", "sizes"),
           sci_col("max_abs_diff", "max|dg|"), sci_col("rel_diff", "rel")}};
  const double scale = max_abs(g_full);
  for (long long k : ks) {
    zero_grads(net->parameters());
    accumulate_grad(net, x, y, k);
    const double diff = max_abs_diff(clone_grads(net->parameters()), g_full);
    t.rows.push_back({{"name", fmt::format("k={}", k)}, {"micro_batches", k}, {"sizes", sizes_text(split_ranges(batch, k))},
                      {"max_abs_diff", diff}, {"rel_diff", diff / scale}});
    report.check(fmt::format("accumulated gradient == full batch (k={})", k), diff, tol);
  }
  t.notes.push_back(fmt::format("rel: max|dg| / max|g| (max|g| = {:.3g}); fp32 eps = 1.2e-7: roundoff only", scale));
  return t;
}

// ----------------------------------------------------------------------------
// 2. Training: S steps side by side
// ----------------------------------------------------------------------------
Table training_table(const Dataset& d, int64_t hidden, int64_t batch, int64_t k, int64_t steps, double lr,
                     std::uint64_t seed, torch::Device dev, double tol, Report& report) {
  auto a = mlp(hidden, false, seed), b = mlp(hidden, false, seed);
  a->to(dev);
  b->to(dev);
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(lr));
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(lr));
  auto order = shuffled_indices(d.size(), seed + 1);
  Table t{"training", fmt::format("Training: {} SGD steps (lr {:g}), batch {} as one batch vs {} micro-batches", steps, lr,
                                  batch, k),
          {text_col("name", "step"), int_col("step", "step"), float_col("loss_full", "loss full", "-", 7),
           float_col("loss_accum", "loss accum", "-", 7), sci_col("loss_diff", "|dloss|"),
           sci_col("param_diff", "max|dw|")}};
  double worst_loss = 0, worst_param = 0;
  std::vector<double> losses_full, losses_accum;
  for (int64_t s = 0; s < steps; ++s) {
    auto idx = (torch::arange(s * batch, (s + 1) * batch, torch::kLong) % d.size()).to(torch::kLong);
    idx = order.index_select(0, idx);
    auto x = d.images.index_select(0, idx).to(dev), y = d.labels.index_select(0, idx).to(dev);
    opt_a.zero_grad();
    auto loss = F::cross_entropy(a->forward(x), y);
    loss.backward();
    opt_a.step();
    opt_b.zero_grad();
    const double loss_b = accumulate_grad(b, x, y, k);
    opt_b.step();
    double pd = 0;
    {
      torch::NoGradGuard ng;
      auto pa = a->parameters(), pb = b->parameters();
      for (std::size_t i = 0; i < pa.size(); ++i) pd = nan_max(pd, (pa[i] - pb[i]).abs().max().item<double>());
    }
    const double la = loss.item<double>();
    // nan_max: once a run diverges its nan differences fail the checks (std::max would drop them)
    worst_loss = nan_max(worst_loss, std::fabs(la - loss_b));
    worst_param = nan_max(worst_param, pd);
    losses_full.push_back(la);
    losses_accum.push_back(loss_b);
    t.rows.push_back({{"name", fmt::format("step {}", s + 1)}, {"step", s + 1}, {"loss_full", la},
                      {"loss_accum", loss_b}, {"loss_diff", std::fabs(la - loss_b)}, {"param_diff", pd}});
  }
  report.check("training: loss curves equal", worst_loss, tol);
  report.check("training: parameters equal", worst_param, tol);
  t.notes.push_back("loss accum: sum over micro-batches of mean loss x size/B, the same quantity as loss full");
  t.notes.push_back("max|dw|: largest parameter difference after the step; roundoff only, it grows slowly with steps");
  note_divergence(report, t, "one batch", losses_full, /*first_step=*/1);  // the table counts steps from 1
  note_divergence(report, t, "accumulated", losses_accum, /*first_step=*/1);
  return t;
}

// ----------------------------------------------------------------------------
// 3. Normalisation pitfalls
// ----------------------------------------------------------------------------
struct Variant {
  std::string name, case_name, rule;
  double diff = 0;
  bool correct = false;
};

// (a) N samples in k unequal micro-batches.
std::vector<Variant> unequal_case(const Dataset& d, int64_t hidden, int64_t n, int64_t k, std::uint64_t seed,
                                  torch::Device dev) {
  auto net = mlp(hidden, false, seed);
  net->to(dev);
  auto x = d.images.slice(0, 0, n).to(dev), y = d.labels.slice(0, 0, n).to(dev);
  auto g_full = full_grad(net, x, y);
  const auto ranges = split_ranges(n, k);
  const std::string case_name = fmt::format("(a) {} samples in {} micro-batches ({})", n, k, sizes_text(ranges));
  std::vector<Variant> out;
  auto run = [&](const std::string& name, const std::string& rule, bool correct, auto loss_of) {
    zero_grads(net->parameters());
    for (auto [b, e] : ranges) loss_of(net->forward(x.slice(0, b, e)), y.slice(0, b, e)).backward();
    out.push_back({name, case_name, rule, max_abs_diff(clone_grads(net->parameters()), g_full), correct});
  };
  const double kd = static_cast<double>(k), nd = static_cast<double>(n);
  run("mean/k", "mean over the micro-batch, divided by k", false,
      [&](const torch::Tensor& o, const torch::Tensor& t) { return F::cross_entropy(o, t) / kd; });
  run("sum/N", "sum over the micro-batch, divided by the global N", true, [&](const torch::Tensor& o, const torch::Tensor& t) {
    return F::cross_entropy(o, t, F::CrossEntropyFuncOptions().reduction(torch::kSum)) / nd;
  });
  return out;
}

// (b) Padded sequences with a different number of valid tokens each.
std::vector<Variant> tokens_case(int64_t nseq, int64_t len, int64_t k, int64_t dim, int64_t classes, std::uint64_t seed,
                                 torch::Device dev) {
  seed_all(seed);
  // Modules pushed one by one: in Sequential(a, b, c) the order in which C++ evaluates the
  // arguments (and so draws the initial weights) is unspecified (GCC: right to left).
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(dim, 32));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Linear(32, classes));
  auto x = torch::randn({nseq, len, dim});
  auto y = torch::randint(classes, {nseq, len}, torch::kLong);
  auto lengths = torch::randint(1, len + 1, {nseq}, torch::kLong);
  auto mask = (torch::arange(len, torch::kLong).unsqueeze(0) < lengths.unsqueeze(1)).to(torch::kFloat);  // [nseq, len]
  net->to(dev);
  x = x.to(dev), y = y.to(dev), mask = mask.to(dev);
  // Per-token cross-entropy [n, len]; padded positions are masked out (ignore_index).
  auto token_loss = [&](int64_t b, int64_t e) {
    auto logits = net->forward(x.slice(0, b, e));  // [m, len, classes]
    auto ce = F::cross_entropy(logits.reshape({-1, classes}), y.slice(0, b, e).reshape({-1}),
                               F::CrossEntropyFuncOptions().reduction(torch::kNone));
    return ce.reshape({e - b, len}) * mask.slice(0, b, e);
  };
  const double total_tokens = mask.sum().item<double>();
  zero_grads(net->parameters());
  (token_loss(0, nseq).sum() / total_tokens).backward();  // the full batch: token mean
  auto g_full = clone_grads(net->parameters());
  const auto ranges = split_ranges(nseq, k);
  const std::string case_name = fmt::format("(b) {} sequences, {:.0f} valid tokens of {}, in {} micro-batches", nseq,
                                            total_tokens, nseq * len, k);
  std::vector<Variant> out;
  auto run = [&](const std::string& name, const std::string& rule, bool correct, auto loss_of) {
    zero_grads(net->parameters());
    for (auto [b, e] : ranges) loss_of(b, e).backward();
    out.push_back({name, case_name, rule, max_abs_diff(clone_grads(net->parameters()), g_full), correct});
  };
  const double kd = static_cast<double>(k);
  run("token_mean/k", "token mean within the micro-batch, divided by k (mean of means)", false,
      [&](int64_t b, int64_t e) { return token_loss(b, e).sum() / mask.slice(0, b, e).sum() / kd; });
  run("seq_mean/N", "mean over each sequence's tokens, then over the sequences", false, [&](int64_t b, int64_t e) {
    return (token_loss(b, e).sum(1) / mask.slice(0, b, e).sum(1)).sum() / static_cast<double>(nseq);
  });
  run("sum/total_tokens", "token sum, divided by the valid tokens of the whole batch", true,
      [&](int64_t b, int64_t e) { return token_loss(b, e).sum() / total_tokens; });
  return out;
}

Table normalisation_table(const std::vector<Variant>& vs, double tol, Report& report) {
  Table t{"normalisation", "Normalisation: which micro-batch loss scaling gives the full-batch gradient",
          {text_col("name", "variant"), text_col("case", "case"), text_col("rule", "micro-batch loss"),
           sci_col("max_abs_diff", "max|dg|"), text_col("verdict", "matches")}};
  for (const auto& v : vs) {
    const bool match = v.diff <= tol;
    t.rows.push_back({{"name", v.name}, {"case", v.case_name}, {"rule", v.rule}, {"max_abs_diff", v.diff},
                      {"verdict", match ? "yes" : "no"}});
    if (v.correct) report.check(fmt::format("normalisation {} == full batch", v.name), v.diff, tol);
  }
  t.notes.push_back("full batch: mean loss over all samples (a) / over all valid tokens (b)");
  t.notes.push_back("the 'k' rules are right only when every micro-batch holds the same number of samples (tokens)");
  return t;
}

// ----------------------------------------------------------------------------
// 4. BatchNorm: statistics per micro-batch
// ----------------------------------------------------------------------------
Table batchnorm_table(const Dataset& d, int64_t hidden, int64_t batch, int64_t k, std::uint64_t seed, torch::Device dev,
                      double tol, Report& report) {
  Table t{"batchnorm", fmt::format("BatchNorm: batch {} vs {} micro-batches, with and without a BatchNorm1d layer", batch, k),
          {text_col("name", "model"), sci_col("max_abs_diff", "max|dg|"), sci_col("rel_diff", "rel"),
           sci_col("running_mean_diff", "max|d mean|")}};
  auto x = d.images.slice(0, 0, batch).to(dev), y = d.labels.slice(0, 0, batch).to(dev);
  for (bool bn : {true, false}) {
    auto a = mlp(hidden, bn, seed), b = mlp(hidden, bn, seed);
    a->to(dev), b->to(dev);
    a->train(), b->train();
    auto g_full = full_grad(a, x, y);
    zero_grads(b->parameters());
    accumulate_grad(b, x, y, k);
    const double diff = max_abs_diff(clone_grads(b->parameters()), g_full);
    double rm = 0;
    if (bn) {
      auto ba = a[2]->as<torch::nn::BatchNorm1d>(), bb = b[2]->as<torch::nn::BatchNorm1d>();
      rm = (ba->running_mean - bb->running_mean).abs().max().item<double>();
    }
    const std::string name = bn ? "with_batchnorm" : "without_batchnorm";
    t.rows.push_back({{"name", name}, {"max_abs_diff", diff}, {"rel_diff", diff / max_abs(g_full)},
                      {"running_mean_diff", rm}});
    if (!bn) report.check("without BatchNorm: accumulated == full batch", diff, tol);
    else report.results["batchnorm_max_abs_diff"] = diff;
  }
  t.notes.push_back("BatchNorm normalises with each micro-batch's own mean and variance: another function of the data");
  t.notes.push_back("max|d mean|: running_mean after one step (k momentum updates instead of one)");
  return t;
}

// ----------------------------------------------------------------------------
// 5. Memory: peak bytes per micro-batch size
// ----------------------------------------------------------------------------
Table memory_table(const Dataset& d, int64_t hidden, int64_t batch, const std::vector<long long>& ks,
                   int64_t repeats, std::uint64_t seed, torch::Device dev, Report& report) {
  install_counting_allocator();
  auto net = mlp(hidden, false, seed, hidden);
  net->to(dev);
  auto x = d.images.slice(0, 0, batch).to(dev), y = d.labels.slice(0, 0, batch).to(dev);
  int64_t param_bytes = 0, largest = 0;
  for (auto& p : net->parameters()) {
    param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    largest = std::max<int64_t>(largest, p.numel() * static_cast<int64_t>(p.element_size()));
  }
  Table t{"memory", fmt::format("Memory: one accumulated step of batch {} (MLP 784-{}-{}-10) per micro-batch size", batch,
                                hidden, hidden),
          {text_col("name", "micro-batch"), int_col("micro_batches", "k"), int_col("micro_batch", "size", "samples"),
           int_col("peak_bytes", "peak", "bytes"), float_col("peak_ratio", "vs k=1", "x", 3),
           int_col("param_bytes", "params", "bytes"), int_col("grad_bytes", "grads", "bytes")}};
  json times = json::object();
  int64_t peak1 = 0;
  auto one_step = [&](int64_t k) {
    zero_grads(net->parameters());
    accumulate_grad(net, x, y, k);
  };
  if (!ks.empty()) one_step(ks.front());  // warm-up: first-touch allocations
  for (long long k : ks) {
    zero_grads(net->parameters());
    int64_t peak = 0;
    {
      PeakScope scope(dev);
      accumulate_grad(net, x, y, k);
      peak = scope.peak_bytes();
    }
    if (peak1 == 0) peak1 = peak;
    const double step_s = median_seconds([&] { one_step(k); }, repeats);  // warmed up above
    const int64_t mb = (batch + k - 1) / k;
    t.rows.push_back({{"name", fmt::format("B/{}", k)}, {"micro_batches", k}, {"micro_batch", mb}, {"peak_bytes", peak},
                      {"peak_ratio", static_cast<double>(peak) / static_cast<double>(peak1)},
                      {"param_bytes", param_bytes}, {"grad_bytes", param_bytes}});
    times[fmt::format("B/{}", k)] = {{"step_s", step_s}, {"samples_per_s", batch / step_s}};
  }
  report.timings["memory_step_time"] = times;
  t.notes.push_back("peak: bytes allocated above parameters and gradients (which exist before the step and do not "
                    "shrink) during the k forward+backward passes");
  t.notes.push_back(fmt::format("floor: a weight gradient is computed into a fresh buffer before it is added into "
                                ".grad; the largest is {} bytes, whatever the micro-batch", largest));
  t.notes.push_back("vs k=1 compares with the first row; step times (more, smaller matrix products) are in timings");
  return t;
}

Report run_accumulate(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  const int64_t batch = cfg.integer("/batch"), samples = cfg.integer("/data/samples"), hidden = cfg.integer("/model/hidden");
  const double tol = cfg.number("/tolerance");
  // Every split was checked by validate_accumulate, which the harness calls before the run.
  const auto ks = cfg.integers("/micro_batches");
  const int64_t un = cfg.integer("/unequal/samples");
  const int64_t mem_batch = cfg.integer("/memory/batch");
  const auto mem_ks = cfg.integers("/memory/micro_batches");

  double t0 = now_seconds();
  Dataset d = load_fashion_mnist(cfg.str("/data/dir"), "train", samples);
  report.timings["load_s"] = now_seconds() - t0;

  t0 = now_seconds();
  report.add(gradients_table(d, hidden, batch, ks, seed, ctx.device, tol, report));
  report.timings["gradients_s"] = now_seconds() - t0;

  t0 = now_seconds();
  report.add(training_table(d, hidden, batch, cfg.integer("/train/micro_batches"), cfg.integer("/train/steps"),
                            cfg.number("/train/lr"), seed, ctx.device, tol, report));
  report.timings["training_s"] = now_seconds() - t0;

  t0 = now_seconds();
  auto vs = unequal_case(d, hidden, un, cfg.integer("/unequal/micro_batches"), seed, ctx.device);
  for (auto& v : tokens_case(cfg.integer("/tokens/sequences"), cfg.integer("/tokens/max_len"),
                             cfg.integer("/tokens/micro_batches"), cfg.integer("/tokens/dim"),
                             cfg.integer("/tokens/classes"), seed, ctx.device))
    vs.push_back(v);
  report.add(normalisation_table(vs, tol, report));
  report.timings["normalisation_s"] = now_seconds() - t0;

  t0 = now_seconds();
  report.add(batchnorm_table(d, hidden, batch, cfg.integer("/batchnorm/micro_batches"), seed, ctx.device, tol, report));
  report.timings["batchnorm_s"] = now_seconds() - t0;

  t0 = now_seconds();
  report.add(memory_table(d, cfg.integer("/memory/hidden"), mem_batch, mem_ks, cfg.integer("/timing/repeats"), seed,
                          ctx.device, report));
  report.timings["memory_s"] = now_seconds() - t0;
  return report;
}

/// Cross-key checks (the harness calls this before the run, exit 2): every micro-batch split
/// has at least one sample per micro-batch, and the BatchNorm comparison at least two (BatchNorm1d
/// in training mode cannot normalise a single sample: LibTorch throws "Expected more than 1
/// value per channel when training"). Throws ConfigError naming both keys.
void validate_accumulate(const Config& cfg, int /*world_size*/) {
  const int64_t batch = cfg.integer("/batch"), samples = cfg.integer("/data/samples");
  if (batch > samples)
    throw ConfigError(fmt::format("/batch: expected at most /data/samples = {}, got {}", samples, batch));
  const auto ks = cfg.integers("/micro_batches");
  for (std::size_t i = 0; i < ks.size(); ++i) check_split(fmt::format("/micro_batches/{}", i), ks[i], "/batch", batch);
  check_split("/train/micro_batches", cfg.integer("/train/micro_batches"), "/batch", batch);
  const int64_t bn_k = cfg.integer("/batchnorm/micro_batches");
  if (batch < 2)
    throw ConfigError(fmt::format("/batch: expected at least 2 for the BatchNorm comparison (BatchNorm1d in training "
                                  "needs 2 samples or more per batch), got {}", batch));
  if (bn_k > batch / 2)
    throw ConfigError(fmt::format("/batchnorm/micro_batches: expected at most /batch / 2 = {} (BatchNorm1d in training "
                                  "needs 2 samples or more in every micro-batch of the /batch = {} samples), got {}",
                                  batch / 2, batch, bn_k));
  const int64_t un = cfg.integer("/unequal/samples");
  if (un > samples)
    throw ConfigError(fmt::format("/unequal/samples: expected at most /data/samples = {}, got {}", samples, un));
  check_split("/unequal/micro_batches", cfg.integer("/unequal/micro_batches"), "/unequal/samples", un);
  check_split("/tokens/micro_batches", cfg.integer("/tokens/micro_batches"), "/tokens/sequences",
              cfg.integer("/tokens/sequences"));
  const int64_t mem_batch = cfg.integer("/memory/batch");
  if (mem_batch > samples)
    throw ConfigError(fmt::format("/memory/batch: expected at most /data/samples = {}, got {}", samples, mem_batch));
  const auto mem_ks = cfg.integers("/memory/micro_batches");
  for (std::size_t i = 0; i < mem_ks.size(); ++i)
    check_split(fmt::format("/memory/micro_batches/{}", i), mem_ks[i], "/memory/batch", mem_batch);
  require_fashion_mnist(cfg.str("/data/dir"), "/data/dir", /*with_test=*/false);
}

/// Memory of a run (core/runtime/memory): the loaded samples (784 floats and an int64 label each), and
/// the larger of the parts (they run one after the other): the MLP 784 -> hidden -> 10 of the
/// gradients, training and BatchNorm comparisons (two models side by side with their gradients
/// and the full-batch reference: 6 parameter-sized tensors; 3 per sample and unit), the memory
/// table's MLP 784 -> h -> h -> 10 (4; 3), and the token case (sequences x max_len tokens of
/// dim features through an MLP dim -> dim -> classes).
MemoryEstimate accumulate_memory(const Config& cfg, int /*world_size*/) {
  const int64_t h = cfg.integer("/model/hidden"), mh = cfg.integer("/memory/hidden");
  MemoryEstimate parts[3];
  add_mlp_training(parts[0], "MLP 784-hidden-10", {784, h, 10}, cfg.integer("/batch"), 6, 3, "/model/hidden",
                   "/batch, /model/hidden");
  add_mlp_training(parts[1], "memory table's MLP", {784, mh, mh, 10}, cfg.integer("/memory/batch"), 4, 3,
                   "/memory/hidden", "/memory/batch, /memory/hidden");
  const int64_t dim = cfg.integer("/tokens/dim");
  add_mlp_training(parts[2], "token MLP", {dim, dim, cfg.integer("/tokens/classes")},
                   cfg.integer("/tokens/sequences") * cfg.integer("/tokens/max_len"), 6, 3,
                   "/tokens/dim, /tokens/classes", "/tokens/sequences, /tokens/max_len, /tokens/dim");
  MemoryEstimate e = parts[0];
  for (auto& p : parts)
    if (p.total() > e.total()) e = p;
  e.add("Fashion-MNIST images and labels", "/data/samples", fashion_mnist_bytes(cfg.integer("/data/samples")));
  return e;
}

}  // namespace

Experiment accumulate_experiment() {
  return {"accumulate", "Gradient accumulation: micro-batches equal one big batch, normalisation pitfalls, memory",
          accumulate_spec, run_accumulate, validate_accumulate, accumulate_memory};
}

}  // namespace mpt
