/*
 * mpt lossscale, section 3 — why autocast keeps softmax, LayerNorm and the logits in fp32:
 * a per-operation precision policy on a tiny GPT (core/models/gpt) trained character-level on
 * Debian's fortunes (core/io/data).
 *
 * A policy names the format of the run (fp32, fp16, bf16) and the operations kept in fp32:
 *   fp16                         every stored tensor in fp16 ("model.half()"): weights, every
 *                                intermediate of the forward (core/models/gpt's sites: embed, ln, qkv,
 *                                scores, probs, attn_out, mlp_hidden, mlp_out, residual, logits)
 *                                and the gradient flowing back through each of them
 *   fp16+fp32_softmax            the same, with the attention probabilities (softmax output) in fp32
 *   fp16+fp32_ln / +fp32_logits  LayerNorm outputs / the logits the loss reads, in fp32
 *   +fp32_<site>                 any site of core/models/gpt; modifiers combine
 * Low precision is emulated (fp32 math, every stored tensor rounded to the format, forward
 * and backward: core/train/amp's emulate_storage), the weights kept as fp32 master weights and
 * rounded into the model before each step, SGD with momentum on the masters, and fp16
 * policies use dynamic loss scaling (core/train/amp's GradScaler with /train/scaler's settings).
 *
 * Per policy: mean training loss of the last steps, validation loss, its gap to fp32, skipped
 * steps; per site stored low: the fraction of values that flush to zero, how many overflow,
 * the largest |value|. The attention probabilities are where fp16 flushes (a probability
 * below 2^-24 ≈ 6e-8 becomes 0); the logits are where the loss loses digits (the cross-entropy
 * of a rounded logit is the loss of another model).
 *
 * The fp32 policy equals PyTorch-Python bit for bit (tests/parity/lossscale_gpt_ref.py): the
 * same model from the same seed, the same batches (nanoGPT's get_batch from a seeded
 * generator) and torch.optim.SGD with momentum (core/train/amp's SgdMomentum: the same ATen operations
 * as its single-tensor step; PyTorch's AdamW would not do: Python's lerps its moments).
 *
 *   mpt lossscale --set train.enabled=false                  # the sweep and this section
 *   mpt lossscale --config configs/lossscale_gpt.json       # the size: 2 x 128, 4 heads, T = 64
 */
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/train/amp.hpp"
#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/experiment.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/numerics/precision.hpp"
#include "core/runtime/runtime.hpp"
#include "experiments/lossscale_parts.hpp"

namespace mpt {

namespace {

const std::vector<std::string> kSites = {"embed", "ln", "qkv", "scores", "probs", "attn_out",
                                         "mlp_hidden", "mlp_out", "residual", "logits"};
const std::vector<std::string> kDefaultPolicies = {"fp32", "fp16", "fp16+fp32_softmax", "fp16+fp32_softmax+fp32_ln+fp32_logits",
                                                   "bf16", "bf16+fp32_softmax+fp32_ln+fp32_logits"};

/// A per-operation precision policy: the run's low format and the sites kept in fp32.
struct OpPolicy {
  std::string name;
  Format low = Format::FP32;
  std::set<std::string> fp32_sites;
  bool low_at(const std::string& site) const { return low != Format::FP32 && fp32_sites.count(site) == 0; }
};

/// "fp32" | "fp16" | "bf16", then "+fp32_<site>" modifiers ("softmax" names the site "probs").
/// Throws ConfigError naming `pointer` for an unknown format or site.
OpPolicy parse_policy(const std::string& name, const std::string& pointer) {
  OpPolicy p{name};
  std::size_t plus = name.find('+');
  const std::string head = name.substr(0, plus);
  if (head == "fp16") p.low = Format::FP16;
  else if (head == "bf16") p.low = Format::BF16;
  else if (head != "fp32")
    throw ConfigError(fmt::format("{}: policy '{}' must start with fp32, fp16 or bf16", pointer, name));
  while (plus != std::string::npos) {
    const std::size_t next = name.find('+', plus + 1);
    const std::string mod = name.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1);
    std::string site = mod.rfind("fp32_", 0) == 0 ? mod.substr(5) : "";
    if (site == "softmax") site = "probs";
    if (std::find(kSites.begin(), kSites.end(), site) == kSites.end())
      throw ConfigError(fmt::format("{}: policy '{}': expected modifiers +fp32_<site> with a site among softmax, {}; got '+{}'",
                                    pointer, name, fmt::join(kSites, ", "), mod));
    if (p.low == Format::FP32)
      throw ConfigError(fmt::format("{}: policy '{}': fp32 has nothing to keep in fp32", pointer, name));
    p.fp32_sites.insert(site);
    plus = next;
  }
  return p;
}

/// What storing a site's tensors in the low format did to their values, over a run.
struct SiteCounts {
  int64_t values = 0, flushed = 0, overflowed = 0;
  double max_abs = 0;
};

struct PolicyRun {
  std::vector<double> loss;
  int64_t skipped = 0;
  double val_loss = NAN, final_scale = 1.0;
  std::map<std::string, SiteCounts> sites;
};

GptConfig gpt_config(const Config& cfg, int64_t vocab) {
  GptConfig g;
  g.vocab = vocab;
  g.context = cfg.integer("/gpt/model/context");
  g.width = cfg.integer("/gpt/model/width");
  g.heads = cfg.integer("/gpt/model/heads");
  g.layers = cfg.integer("/gpt/model/layers");
  return g;
}

/// The forward hook of a policy: sites stored low are rounded (forward and backward); when
/// `counts` is given, each one's flushes, overflows and largest |value| are counted.
GptHook policy_hook(const OpPolicy& p, std::map<std::string, SiteCounts>* counts) {
  return [&p, counts](const torch::Tensor& x, const std::string& site) {
    if (!p.low_at(site)) return x;
    auto stored = emulate_storage(x, p.low);
    if (counts) {
      torch::NoGradGuard ng;
      auto& c = (*counts)[site];
      c.values += x.numel();
      c.flushed += ((x != 0) & (stored == 0)).sum().item<int64_t>();
      c.overflowed += (torch::isfinite(x) & ~torch::isfinite(stored)).sum().item<int64_t>();
      c.max_abs = std::max(c.max_abs, x.abs().max().item<double>());
    }
    return stored;
  };
}

PolicyRun train_policy(const Context& ctx, const OpPolicy& p, const TextCorpus& corpus) {
  const auto& cfg = ctx.cfg;
  const int64_t steps = cfg.integer("/gpt/steps"), batch = cfg.integer("/gpt/batch");
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  seed_all(seed);
  TinyGpt model(gpt_config(cfg, corpus.vocab()));
  // A sharp attention (configs/lossscale_gpt_sharp.json): q and k rows of c_attn scaled, scores ~ s².
  scale_qk_init(*model, cfg.number("/gpt/model/qk_init_scale"));
  model->to(ctx.device);
  auto params = model->parameters();
  // fp32 master weights; the model holds their rounded copies (the fp32 policy: the same values).
  std::vector<torch::Tensor> master;
  for (const auto& w : params) master.push_back(w.detach().clone());
  SgdMomentum opt(master, cfg.number("/gpt/lr"), cfg.number("/gpt/momentum"));
  GradScaler scaler(scaler_options(cfg));
  const bool scaled = p.low == Format::FP16;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  PolicyRun run;
  const GptHook hook = policy_hook(p, &run.sites);
  Progress progress(ctx.tty, "gpt " + p.name, steps, "steps");
  for (int64_t step = 0; step < steps; ++step) {
    {
      torch::NoGradGuard ng;
      for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(round_to(master[i], p.low));
    }
    auto [x, y] = text_batch(corpus.train, batch, cfg.integer("/gpt/model/context"), gen);
    auto loss = gpt_loss(model->forward(x.to(ctx.device), hook), y.to(ctx.device));
    run.loss.push_back(loss.item<double>());
    progress.update(step + 1, fmt::format("loss {:.4f}", run.loss.back()));
    (scaled ? scaler.scale(loss) : loss).backward();
    for (std::size_t i = 0; i < params.size(); ++i) {
      // The weight gradient is stored in the format too; the master's gradient holds it.
      master[i].mutable_grad() = round_to(params[i].grad(), p.low);
      params[i].mutable_grad() = torch::Tensor();
    }
    auto sgd_step = [&] { opt.step(); };
    if (scaled) {
      if (!scaler.step(master, sgd_step)) ++run.skipped;
      scaler.update();
    } else {
      sgd_step();
    }
    opt.zero_grad();
  }
  progress.finish();
  run.final_scale = scaled ? scaler.get_scale() : 1.0;
  // Validation: fixed windows of the validation split, the policy's forward, no counting.
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(round_to(master[i], p.low));
  auto vgen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  double sum = 0;
  const int64_t eval_batches = cfg.integer("/gpt/eval_batches");
  for (int64_t b = 0; b < eval_batches; ++b) {
    auto [x, y] = text_batch(corpus.val, batch, cfg.integer("/gpt/model/context"), vgen);
    sum += gpt_loss(model->forward(x.to(ctx.device), policy_hook(p, nullptr)), y.to(ctx.device)).item<double>();
  }
  run.val_loss = sum / static_cast<double>(eval_batches);
  return run;
}

}  // namespace

void add_gpt_spec(ConfigSpec& s) {
  s.boolean("/gpt/enabled", true, "train the tiny GPT under per-operation precision policies (section 3)");
  s.strings("/gpt/policies", kDefaultPolicies, {},
            "policies: fp32 | fp16 | bf16, then +fp32_<site> modifiers (softmax, ln, logits, or any site of core/models/gpt)");
  add_text_keys(s, "/gpt");
  s.integer("/gpt/model/layers", 2, "transformer blocks", 1, 48);
  s.integer("/gpt/model/width", 64, "model width (n_embd)", 1, 4096);
  s.integer("/gpt/model/heads", 4, "attention heads (must divide the width)", 1, 256);
  s.integer("/gpt/model/context", 32, "tokens per sequence (block size)", 1, 4096);
  Param qk{ParamType::Number, 1.0,
           "factor on the initial query and key weights (rows [0, 2C) of each c_attn): the initial attention "
           "scores grow by about its square, so that fp16 scores overflow (configs/lossscale_gpt_sharp.json); "
           "1 = PyTorch's initialisation; in [1e-4, 1e4]: 1e4 already grows the scores 1e8-fold, and far "
           "larger factors overflow the fp16 weights themselves (about 65504 sqrt(C)), where the table's "
           "overflow counts see only NaN"};
  qk.min = 1e-4;
  qk.max = 1e4;
  s.add("/gpt/model/qk_init_scale", qk);
  s.integer("/gpt/batch", 16, "sequences per step", 1, 4096);
  s.integer("/gpt/steps", 60, "SGD steps per policy", 1, 10'000'000);
  add_gpt_training_keys(s, "/gpt", 0.3, 0.9);
}

void validate_gpt(const Config& cfg) {
  if (!cfg.boolean("/gpt/enabled")) return;
  const auto names = cfg.strings("/gpt/policies");
  if (names.empty()) throw ConfigError("/gpt/policies: expected at least one policy, got []");
  for (std::size_t i = 0; i < names.size(); ++i) parse_policy(names[i], fmt::format("/gpt/policies/{}", i));
  const int64_t w = cfg.integer("/gpt/model/width"), h = cfg.integer("/gpt/model/heads");
  if (w % h != 0)
    throw ConfigError(fmt::format("/gpt/model/heads: expected a divisor of /gpt/model/width ({}), got {}", w, h));
  validate_text_files(cfg, "/gpt", "/gpt/model/context");  // files that split into more tokens than the context
}

MemoryEstimate gpt_memory(const Config& cfg) {
  GptConfig g = gpt_config(cfg, 96);  // the vocabulary is at most 96 characters (clean_fortune_text)
  const double P = static_cast<double>(gpt_num_params(g));
  const double B = static_cast<double>(cfg.integer("/gpt/batch")), T = static_cast<double>(g.context),
               C = static_cast<double>(g.width), a = static_cast<double>(g.heads), L = static_cast<double>(g.layers);
  MemoryEstimate e;
  // model, master, gradient (model's and master's), momentum, rounded copy: 6 parameter-sized tensors
  e.add("tiny GPT parameters x 6 (model, master, gradients, momentum, rounded copy)",
        "/gpt/model/width, /gpt/model/layers", 6 * P * 4);
  // Korthikanti et al. 2022's activations per block, sbh(34 + 5as/h) bytes for 16-bit values, as
  // fp32 elements (x2) and doubled for the stored copies a policy's sites make; plus the logits.
  e.add("tiny GPT activations (Korthikanti et al. 2022, fp32, with the sites' stored copies)",
        "/gpt/batch, /gpt/model/context, /gpt/model/width, /gpt/model/heads, /gpt/model/layers",
        gpt_activation_bytes(L, T, B, C, a, 96, /*copies=*/2));
  return e;
}

namespace {

/// The gpt_sites row of low-precision policy `p`: what storing low flushed and overflowed over
/// every site, the probabilities flushed, the largest |score| and |logit|; appends one entry per
/// site to `per_site` (results.gpt_site_counts).
json sites_row(const OpPolicy& p, const PolicyRun& run, json& per_site) {
  SiteCounts all;
  for (const auto& [site, c] : run.sites) {
    all.values += c.values;
    all.flushed += c.flushed;
    all.overflowed += c.overflowed;
    per_site.push_back({{"name", p.name + "/" + site}, {"policy", p.name}, {"site", site},
                        {"values", c.values}, {"flushed_count", c.flushed}, {"overflowed", c.overflowed},
                        {"max_abs", num(c.max_abs)}});
  }
  auto at = [&](const char* site) { return run.sites.count(site) ? run.sites.at(site) : SiteCounts{}; };
  const SiteCounts probs = at("probs");
  return {{"name", p.name}, {"flushed", all.values ? static_cast<double>(all.flushed) / static_cast<double>(all.values) : 0.0},
          {"flushed_count", all.flushed}, {"overflowed", all.overflowed},
          {"probs_flushed", probs.values ? static_cast<double>(probs.flushed) / static_cast<double>(probs.values) : 0.0},
          {"max_scores", at("scores").values ? num(at("scores").max_abs) : json("nan")},
          {"max_logits", at("logits").values ? num(at("logits").max_abs) : json("nan")}};
}

}  // namespace

// gpt_section (documented in lossscale_parts.hpp): one training run per policy, then its rows.
void gpt_section(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  TextCorpus corpus = load_text_corpus_at(cfg, "/gpt");  // validate_gpt checked its split against the context
  const GptConfig g = gpt_config(cfg, corpus.vocab());
  const int64_t last = std::min(cfg.integer("/gpt/mean_of_last"), cfg.integer("/gpt/steps"));
  Table t{"gpt_policies",
          fmt::format("Per-operation precision: tiny GPT {}x{} ({} heads, T = {}, vocab {}, {} parameters) on fortunes, "
                      "{} steps of {} sequences, SGD lr {:g} momentum {:g}{}",
                      g.layers, g.width, g.heads, g.context, g.vocab, gpt_num_params(g), cfg.integer("/gpt/steps"),
                      cfg.integer("/gpt/batch"), cfg.number("/gpt/lr"), cfg.number("/gpt/momentum"),
                      cfg.number("/gpt/model/qk_init_scale") == 1.0
                          ? std::string()
                          : fmt::format(", q/k init x {:g}", cfg.number("/gpt/model/qk_init_scale"))),
          {text_col("name", "policy"), float_col("train_loss", "train loss"), float_col("val_loss", "val loss"),
           float_col("val_gap", "vs fp32"), int_col("skipped_steps", "skipped", "steps"),
           sci_col("final_scale", "final S", "-", 3)}};
  Table sites{"gpt_sites", "What storing in the low format did to the forward values, over the training steps",
              {text_col("name", "policy"), pct_col("flushed", "->0", 4), int_col("overflowed", "->inf"),
               pct_col("probs_flushed", "probs ->0", 4), sci_col("max_scores", "max |score|", "-", 3),
               sci_col("max_logits", "max |logit|", "-", 3)}};
  json per_site = json::array();
  double max_scores = 0;
  json history = json::object();
  double fp32_val = NAN;
  const auto names = cfg.strings("/gpt/policies");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const OpPolicy p = parse_policy(names[i], fmt::format("/gpt/policies/{}", i));
    PolicyRun run = train_policy(ctx, p, corpus);
    double tail = 0;
    for (std::size_t s = run.loss.size() - static_cast<std::size_t>(last); s < run.loss.size(); ++s) tail += run.loss[s];
    tail /= static_cast<double>(last);
    if (p.low == Format::FP32 && std::isnan(fp32_val)) fp32_val = run.val_loss;
    t.rows.push_back({{"name", p.name}, {"format", format_name(p.low)},
                      {"fp32_sites", json(std::vector<std::string>(p.fp32_sites.begin(), p.fp32_sites.end()))},
                      {"train_loss", num(tail)}, {"val_loss", num(run.val_loss)},
                      {"val_gap", std::isnan(fp32_val) ? json("nan") : num(run.val_loss - fp32_val)},
                      {"skipped_steps", run.skipped}, {"final_scale", run.final_scale}});
    json h = json::array();
    for (double v : run.loss) h.push_back(num(v));
    history[p.name] = {{"loss", h}};
    note_divergence(report, t, p.name, run.loss, /*first_step=*/1);  // counted from 1, as the MLP part's curve
    if (p.low == Format::FP32) continue;
    sites.rows.push_back(sites_row(p, run, per_site));
    if (run.sites.count("scores")) max_scores = std::max(max_scores, run.sites.at("scores").max_abs);
  }
  t.notes.push_back(fmt::format("train loss: the mean of the last {} training losses; val loss: {} fixed batches of the "
                                "validation split, with the policy's forward; vs fp32: val loss minus the first fp32 "
                                "policy's", last, cfg.integer("/gpt/eval_batches")));
  t.notes.push_back("low precision is emulated: fp32 math, weights and every intermediate of a site stored low rounded "
                    "(forward, and the gradient flowing back); fp16 policies use dynamic loss scaling (/train/scaler)");
  sites.notes.push_back("->0 / ->inf: over every site stored low (per site: results.gpt_site_counts); nonzero values "
                        "the format flushes to zero (fp16: below 2^-24, bf16: below 2^-133), finite values beyond its max "
                        "(fp16: 65504); nan: the site is kept in fp32");
  // A softmax row p_i = exp(s_i − max s) / Σ exp(s_j − max s) holds its smallest probability
  // above exp(−(max s − min s)) / T, so fp16 (smallest subnormal 2^-24) can flush one only
  // where a row's score spread exceeds ln(2^24) − ln T; the spread is at most 2·max|s|.
  if (!sites.rows.empty() && max_scores > 0)
    sites.notes.push_back(fmt::format("probs: fp16 flushes a probability only where a row's score spread exceeds "
                                      "24·ln 2 − ln T = {:.3g} (T = {}); the largest |score| here was {:.3g}, so the "
                                      "spread was at most {:.3g}",
                                      24 * std::log(2.0) - std::log(static_cast<double>(g.context)), g.context,
                                      max_scores, 2 * max_scores));
  report.add(std::move(t));
  report.add(std::move(sites));
  report.results["gpt_history"] = history;
  report.results["gpt_site_counts"] = per_site;
}

}  // namespace mpt
