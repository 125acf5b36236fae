/*
 * mpt fp4 — 4-bit training recipes emulated bit for bit (core/numerics/quant): the NVFP4 recipe and its
 * ablations, and MXFP4, on the Fashion-MNIST MLP of `mpt fp8` (core/train/quant_train).
 *
 * NVFP4 (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149, §4): E2M1
 * elements in 1x16 blocks with UE4M3 block scales under an fp32 tensor scale, and four choices:
 *   2-D weights  W in 16x16 blocks, so that the forward (W) and the backward (W^T) see the same
 *                quantized weights
 *   SR           stochastic rounding of the gradient dy (dgrad and wgrad), round to nearest elsewhere
 *   RHT          a 16x16 random Hadamard transform of both wgrad operands along the batch, which
 *                spreads outliers before the 4-bit cast
 *   bf16 layers  the first and last Linear kept in bf16
 * The ablation grid trains the full recipe, then the recipe without each choice, and MXFP4 (OCP MX
 * v1.0: E2M1 in 1x32 blocks, E8M0 scales, FLOOR), beside fp32 and bf16, from one seed on the same
 * batches. Table: test loss and accuracy, the gap of each to bf16 and to the full NVFP4 recipe, and
 * the relative error of each GEMM (out, dgrad, wgrad) at one step, averaged over the 4-bit layers.
 * The last Linear (10 outputs) stays bf16 in every variant: 10 fits no 16-element block.
 * tests/parity/fp4_ref.py, a PyTorch-Python twin, reproduces every variant's numbers bit for bit.
 *
 *   mpt fp4
 *   mpt fp4 --set "variants=[\"bf16\",\"nvfp4\",\"nvfp4_no_rht\"]" --set train.steps=400
 */
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/runtime/memory.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/quant.hpp"
#include "core/train/quant_train.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"

namespace mpt {

namespace {

namespace q = mpt::quant;

constexpr const char* kGptModel = "/gpt/model";

const std::vector<std::string> kVariants = {"fp32",         "bf16",          "nvfp4",       "nvfp4_no_sr",
                                            "nvfp4_no_rht", "nvfp4_no_2d",   "nvfp4_no_bf16", "mxfp4"};

ConfigSpec fp4_spec() {
  ConfigSpec s;
  s.integer("/seed", 0, "seed of the model (torch.manual_seed), the data order and the stochastic rounding", 0);
  s.string("/data/dir", kFashionMnistDir, "folder with the Fashion-MNIST IDX .gz files");
  s.integer("/data/train_samples", 10000, "training samples used (first N of the 60000)", 1, 60000);
  s.integer("/data/test_samples", 1000, "test samples used (first N of the 10000)", 1, 10000);
  s.integers("/model/hidden", {256, 256, 256}, "hidden widths of the MLP 784 - hidden... - 10 (multiples of 32 for MXFP4, 16 for NVFP4)", 1, 8192);
  s.strings("/variants", kVariants, kVariants, "recipes of the ablation grid (fp32 is required: the reference of the emulation cost)");
  s.integer("/train/steps", 150, "SGD steps per variant", 1, 1'000'000);
  s.integer("/train/batch", 128, "samples per step (a multiple of 16 and 32: wgrad reduces over it)", 1, 60000);
  s.number("/train/lr", 0.1, "SGD learning rate", 0.0, 100.0);
  s.integer("/train/log_every", 50, "loss-curve sampling interval (steps)", 1, 1'000'000);
  s.integer("/ledger/step", 75, "training step (0-based) whose GEMM errors the table shows", 0, 1'000'000);
  // The tiny GPT section (off by default: it does not fit the 60 s budget; configs/fp4_gpt.json)
  s.boolean("/gpt/enabled", false,
            "also run the ablation grid on the tiny GPT (its blocks' Linears in the variant; off by default: see "
            "configs/fp4_gpt.json and docs/fp4.md for its run time)");
  GptKeyDefaults d;
  d.layers = 2;
  d.width = 64;  // a multiple of 32 (MXFP4's 1x32) and of 16 (NVFP4's 1x16, 16x16), as 3C and 4C
  d.heads = 4;
  d.context = 32;
  d.mlp_ratio = 4;
  add_gpt_keys(s, kGptModel, d);
  add_text_keys(s, "/gpt");
  s.integer("/gpt/batch", 16, "sequences per step (batch x context tokens: a multiple of 32, wgrad reduces over them)", 1, 4096);
  s.integer("/gpt/steps", 100, "SGD steps per variant", 1, 10'000'000);
  add_gpt_training_keys(s, "/gpt", 0.3, 0.9);
  s.integer("/gpt/ledger_step", 50, "training step (0-based) whose GEMM errors the GPT's table shows", 0, 10'000'000);
  s.integer("/gpt/log_every", 10, "loss-curve sampling interval (steps)", 1, 10'000'000);
  return s;
}

/// Variant → per-layer recipes (L layers in order). The first and the last layer are the "bf16
/// layers" of the recipe, kept in bf16 unless "no_bf16"; with `last_always_bf16` (the MLP, whose
/// last Linear's 10 outputs fit no 16-block) the last stays bf16 in every variant.
std::vector<q::QuantRecipe> variant_recipes(const std::string& v, std::size_t L, std::uint64_t seed,
                                            bool last_always_bf16 = true) {
  std::vector<q::QuantRecipe> rs;
  for (std::size_t l = 0; l < L; ++l) {
    const bool kept = v != "nvfp4_no_bf16";
    const bool edge = (l + 1 == L && (last_always_bf16 || kept)) || (l == 0 && kept);
    if (v == "fp32" || v == "bf16" || edge) {
      rs.push_back(q::recipe(v == "fp32" ? "fp32" : "bf16"));
      continue;
    }
    q::QuantRecipe r = q::recipe(v == "mxfp4" ? "mxfp4" : "nvfp4");
    if (v == "nvfp4_no_sr") r.dgrad.a.rounding = r.wgrad.a.rounding = q::Rounding::NearestEven;
    if (v == "nvfp4_no_rht") r.wgrad.rht = false;
    if (v == "nvfp4_no_2d") r.out.b.block = r.dgrad.b.block = {1, 16};  // W and W^T each in 1x16 along its own k
    r.name = v;
    r.seed = seed + 7919 * (l + 1);
    rs.push_back(r);
  }
  return rs;
}

std::vector<int64_t> widths(const Config& cfg) {
  std::vector<int64_t> w{784};
  for (long long h : cfg.integers("/model/hidden")) w.push_back(h);
  w.push_back(10);
  return w;
}

/// Tokens per GPT step: the M of the out and dgrad GEMMs and the K of wgrad.
int64_t gpt_tokens(const Config& cfg) { return cfg.integer("/gpt/batch") * cfg.integer("/gpt/model/context"); }

/// A variant's recipes for the GPT's block Linears (gpt_linear_shapes' order): the same choices
/// as the MLP's, with the first (h0.c_attn) and the last (h<L-1>.mlp_proj) Linear as the bf16
/// layers; "no_bf16" puts both in 4 bits (their widths fit the blocks, unlike the MLP's 10 outputs).
std::vector<q::QuantRecipe> gpt_variant_recipes(const std::string& v, const GptConfig& g, std::uint64_t seed) {
  return variant_recipes(v, q::gpt_linear_shapes(g).size(), seed, /*last_always_bf16=*/false);
}

/// The GPT section's cross-key checks (exit 2): the GPT and text keys, the ledger step, and every
/// variant's blocks dividing each Linear's operands (naming /gpt/model/width or /gpt/batch).
void validate_fp4_gpt(const Config& cfg) {
  if (!cfg.boolean("/gpt/enabled")) return;
  validate_gpt_keys(cfg, kGptModel, "/gpt");
  if (cfg.integer("/gpt/ledger_step") >= cfg.integer("/gpt/steps"))
    throw ConfigError(fmt::format("/gpt/ledger_step: expected a step below /gpt/steps = {}, got {}", cfg.integer("/gpt/steps"),
                                  cfg.integer("/gpt/ledger_step")));
  const GptConfig g = gpt_config_at(cfg, kGptModel, 1);  // the vocabulary does not enter the block Linears
  const int64_t m = gpt_tokens(cfg);
  const auto shapes = q::gpt_linear_shapes(g);
  for (const auto& v : cfg.strings("/variants")) {
    const auto rs = gpt_variant_recipes(v, g, 0);
    const int64_t block = v == "mxfp4" ? 32 : 16;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string err = q::shape_error(rs[i], m, shapes[i].in, shapes[i].out);
      if (err.empty()) continue;
      // 32 tokens divide every block: if the layer still fails, a width is what the blocks do not divide.
      if (!q::shape_error(rs[i], 32, shapes[i].in, shapes[i].out).empty())
        throw ConfigError(fmt::format("/gpt/model/width: expected a multiple of {} (variant {} on the GPT's {}, {} -> {}: {}), "
                                      "got {}", block, v, shapes[i].name, shapes[i].in, shapes[i].out, err,
                                      cfg.integer("/gpt/model/width")));
      throw ConfigError(fmt::format("/gpt/batch: expected /gpt/batch x /gpt/model/context (the tokens a step, over which wgrad "
                                    "reduces) a multiple of {} (variant {} on the GPT's {}, {} -> {}: {}), got {} x {} = {}",
                                    block, v, shapes[i].name, shapes[i].in, shapes[i].out, err, cfg.integer("/gpt/batch"),
                                    cfg.integer("/gpt/model/context"), m));
    }
  }
}

/// Cross-key checks before any work and before the data are read (exit 2, ConfigError naming the
/// JSON pointer): fp32 among the variants (the reference of the cost table's "vs fp32"), at least
/// one 4-bit layer, every 4-bit layer's GEMM operands divisible by its blocks (naming the hidden
/// width, /train/batch, or /data/train_samples when fewer samples than a batch make the step's
/// batch), and the ledger step inside the run.
void validate_fp4(const Config& cfg, int /*world_size*/) {
  const auto variants = cfg.strings("/variants");
  if (std::find(variants.begin(), variants.end(), "fp32") == variants.end())
    throw ConfigError("/variants: expected a list containing \"fp32\" (the reference of the emulation cost, vs fp32), got " +
                      cfg.json_value()["variants"].dump());
  // The first and last Linear stay bf16 (but in nvfp4_no_bf16): one hidden layer leaves no 4-bit layer.
  if (cfg.integers("/model/hidden").size() < 2)
    throw ConfigError(fmt::format("/model/hidden: expected at least two hidden layers (the first and last Linear stay in "
                                  "bf16, so one hidden layer leaves no layer in 4 bits), got {}",
                                  cfg.json_value()["model"]["hidden"].dump()));
  const auto w = widths(cfg);
  const int64_t batch = cfg.integer("/train/batch"), samples = cfg.integer("/data/train_samples");
  const int64_t m = std::min(batch, samples);  // q::train's step batch
  // 32 is a multiple of every block dimension of the fp4 recipes (1x16, 16x16, 1x32): a dimension
  // set to it divides, so the dimension left at its configured value is the one that does not.
  constexpr int64_t kDivisible = 32;
  for (const auto& v : variants) {
    const auto rs = variant_recipes(v, w.size() - 1, 0);
    const int64_t block = v == "mxfp4" ? 32 : 16;
    for (std::size_t l = 0; l < rs.size(); ++l) {
      // The hidden widths first (the batch set divisible): n = w[l+1] is hidden[l], k = w[l] is hidden[l-1].
      if (!q::shape_error(rs[l], kDivisible, w[l], w[l + 1]).empty()) {
        // The operand named is a width's (the GEMM operands with the batch in a block come last).
        const std::string err = q::shape_error(rs[l], m, w[l], w[l + 1]);
        // The output width unless the layer still fails with it set divisible (then the input width).
        // Layer 0's input (784 = 49 x 16) and the last layer (bf16 in every variant) never fail.
        const bool k_bad = l > 0 && !q::shape_error(rs[l], kDivisible, w[l], kDivisible).empty();
        const std::size_t i = k_bad ? l - 1 : l;
        throw ConfigError(fmt::format("/model/hidden/{}: expected a multiple of {} (variant {} on layer {}, {} -> {}, batch {}: {}), "
                                      "got {}", i, block, v, l + 1, w[l], w[l + 1], m, err, w[i + 1]));
      }
    }
    for (std::size_t l = 0; l < rs.size(); ++l) {
      const std::string err = q::shape_error(rs[l], m, w[l], w[l + 1]);
      if (err.empty()) continue;
      if (m == batch)
        throw ConfigError(fmt::format("/train/batch: expected a multiple of {} (variant {} on layer {}, {} -> {}, batch {}: {}; "
                                      "wgrad reduces over the batch), got {}", block, v, l + 1, w[l], w[l + 1], m, err, batch));
      throw ConfigError(fmt::format("/data/train_samples: expected at least /train/batch = {} or a multiple of {} (with fewer "
                                    "samples than a batch a step takes all {}: variant {} on layer {}, {} -> {}: {}), got {}",
                                    batch, block, samples, v, l + 1, w[l], w[l + 1], err, samples));
    }
  }
  if (cfg.integer("/ledger/step") >= cfg.integer("/train/steps"))
    throw ConfigError(fmt::format("/ledger/step: expected a step below /train/steps = {}, got {}", cfg.integer("/train/steps"),
                                  cfg.integer("/ledger/step")));
  validate_fp4_gpt(cfg);
  require_fashion_mnist(cfg.str("/data/dir"), "/data/dir", /*with_test=*/true);
}

/// Sums of stored_bytes (computed) and measured_stored_bytes (nullopt if any layer is not
/// measurable) over layers of `m` rows with shapes (in, out) under recipes `rs`.
struct MemoryRow {
  q::StoredBytes computed, measured;
  bool measurable = true;
};
MemoryRow memory_row(const std::vector<q::QuantRecipe>& rs, int64_t m, const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  MemoryRow r;
  auto add = [](q::StoredBytes& to, const q::StoredBytes& b) {
    to.weights += b.weights;
    to.activations += b.activations;
    to.gradients += b.gradients;
    to.scales += b.scales;
  };
  for (std::size_t l = 0; l < rs.size(); ++l) {
    add(r.computed, q::stored_bytes(rs[l], m, shapes[l].first, shapes[l].second));
    if (const auto mb = q::measured_stored_bytes(rs[l], m, shapes[l].first, shapes[l].second)) add(r.measured, *mb);
    else r.measurable = false;
  }
  return r;
}
json memory_json(const std::string& name, const MemoryRow& r) {
  const q::StoredBytes& c = r.computed;
  const q::StoredBytes& m = r.measured;
  return {{"name", name}, {"weights", c.weights}, {"activations", c.activations}, {"gradients", c.gradients},
          {"scales", c.scales}, {"total", c.weights + c.activations + c.gradients + c.scales},
          {"measured", r.measurable ? json(m.weights + m.activations + m.gradients + m.scales)
                                    : json(nullptr)},
          {"measured_parts", r.measurable ? json{{"weights", m.weights}, {"activations", m.activations},
                                                 {"gradients", m.gradients}, {"scales", m.scales}}
                                          : json(nullptr)}};
}

/// Mean relative error of each GEMM (out, dgrad, wgrad) at the ledger step over the layers that
/// `counted` marks; find(i, gemm) is layer i's ledger entry (null when it has none). NaN for a
/// GEMM no counted layer has.
std::map<std::string, double> mean_gemm_errors(const std::vector<bool>& counted,
                                               const std::function<const q::GemmLedger*(std::size_t, const char*)>& find) {
  std::map<std::string, double> errors;
  for (const char* gemm : {"out", "dgrad", "wgrad"}) {
    double sum = 0;
    int count = 0;
    for (std::size_t i = 0; i < counted.size(); ++i) {
      if (!counted[i]) continue;
      if (const q::GemmLedger* e = find(i, gemm)) {
        sum += e->rel_error;
        ++count;
      }
    }
    errors[gemm] = count ? sum / count : NAN;
  }
  return errors;
}

/// The layers whose GEMM errors a variant's row averages: the 4-bit ones (the bf16 edges of the
/// 4-bit variants left out), all of them for fp32 and bf16.
std::vector<bool> counted_layers(const std::string& v, const std::vector<q::QuantRecipe>& rs) {
  std::vector<bool> counted;
  for (const auto& r : rs) counted.push_back(v == "fp32" || v == "bf16" || r.out.a.element == q::Element::E2M1);
  return counted;
}

/// A cost table: emulated step time per variant against fp32's (run-dependent: timings).
Table cost_table(const std::string& name, const std::string& title) {
  return {name, title,
          {text_col("name", "variant"), float_col("step_ms", "step", "ms", 3), float_col("vs_fp32", "vs fp32", "x", 3)}};
}
json cost_row(const std::string& v, double step_s, double fp32_step_s) {
  return {{"name", v}, {"step_ms", step_s * 1e3}, {"vs_fp32", num(step_s / fp32_step_s)}, {"step_time_s", step_s}};
}

/// A memory table's header (rows: memory_json).
Table memory_table(const std::string& name, const std::string& title) {
  return {name, title,
          {text_col("name", "variant"), int_col("weights", "weights", "bytes"), int_col("activations", "activations", "bytes"),
           int_col("gradients", "gradients", "bytes"), int_col("scales", "scales", "bytes"), int_col("total", "total", "bytes"),
           int_col("measured", "measured", "bytes")}};
}

/// A loss curve: one row every `every` steps (from step 0), one column per variant.
template <class Runs>
Table loss_curve(const std::string& name, const std::string& title, const std::vector<std::string>& variants, int64_t steps,
                 int64_t every, Runs& runs) {
  Table curve{name, title, {int_col("step", "step")}};
  for (const auto& v : variants) curve.columns.push_back(float_col(v, v));
  for (int64_t s = 0; s < steps; s += every) {
    json row = {{"name", fmt::format("step{}", s)}, {"step", s}};
    for (const auto& v : variants) row[v] = num(runs[v].loss[static_cast<std::size_t>(s)]);
    curve.rows.push_back(row);
  }
  return curve;
}

/// A variant's training losses, for results.history / gpt_history.
json loss_history(const std::vector<double>& loss) {
  json h = json::array();
  for (double x : loss) h.push_back(num(x));
  return h;
}

/// The GPT's runs and mean GEMM errors per variant.
struct GptRuns {
  std::map<std::string, q::GptTrainRun> runs;
  std::map<std::string, std::map<std::string, double>> errors;
};

/// Trains the tiny GPT under every variant of /variants from the same weights (seeded before
/// each) on the same batches; fills `mem` with each variant's stored bytes.
GptRuns train_gpt_variants(const Context& ctx, const TextCorpus& corpus, const GptConfig& g, const q::GptTrainPlan& plan,
                           Table& mem) {
  const auto& cfg = ctx.cfg;
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  const int64_t ledger_step = cfg.integer("/gpt/ledger_step");
  const auto shapes = q::gpt_linear_shapes(g);
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (const auto& sh : shapes) dims.emplace_back(sh.in, sh.out);
  GptRuns out;
  for (const auto& v : cfg.strings("/variants")) {
    seed_all(seed);
    TinyGpt model(g);  // the same weights for every variant
    const auto rs = gpt_variant_recipes(v, g, seed);
    q::QuantGptLinears lin = q::make_quant_gpt_linears(g, rs);
    const q::GptTrainRun& run = out.runs[v] = q::train_gpt(model, lin, corpus, plan, ctx.tty, "fp4: gpt " + v);
    out.errors[v] = mean_gemm_errors(counted_layers(v, rs), [&](std::size_t i, const char* gemm) {
      return q::find_gemm(run.ledger.at(shapes[i].name), ledger_step, gemm);
    });
    mem.rows.push_back(memory_json(v, memory_row(rs, gpt_tokens(cfg), dims)));
  }
  return out;
}

/// The tiny GPT section: the ablation grid on the GPT's block Linears (core/train/quant_train's
/// train_gpt, as fp8's GPT section), from one seed on the same batches. Adds tables gpt_variants,
/// gpt_memory, gpt_loss_curve, timings gpt_cost, results.gpt_history.
void gpt_section(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  const TextCorpus corpus = load_text_corpus_at(cfg, "/gpt");
  const GptConfig g = gpt_config_at(cfg, kGptModel, corpus.vocab());
  const int64_t steps = cfg.integer("/gpt/steps");
  const int64_t last = std::min<int64_t>(cfg.integer("/gpt/mean_of_last"), steps);
  const auto variants = cfg.strings("/variants");
  const q::GptTrainPlan plan = q::gpt_train_plan_at(cfg, "/gpt", static_cast<std::uint64_t>(cfg.integer("/seed")));
  Table mem = memory_table("gpt_memory", fmt::format("Tiny GPT: bytes stored per variant by the blocks' Linears (computed at "
                                                     "the formats' widths, and measured in LibTorch's low-bit dtypes), {} "
                                                     "tokens a step", gpt_tokens(cfg)));
  GptRuns gr = train_gpt_variants(ctx, corpus, g, plan, mem);
  auto& runs = gr.runs;
  auto tail_mean = [&](const q::GptTrainRun& r) {
    double sum = 0;
    for (std::size_t i = r.loss.size() - static_cast<std::size_t>(last); i < r.loss.size(); ++i) sum += r.loss[i];
    return sum / static_cast<double>(last);
  };
  auto diverged = [&](const q::GptTrainRun& r) {
    return !std::isfinite(r.val_loss) ||
           std::any_of(r.loss.begin(), r.loss.end(), [](double x) { return !std::isfinite(x); });
  };
  auto gap = [&](const std::string& base, const std::string& v) -> json {
    if (!runs.count(base)) return nullptr;
    return diverged(runs[v]) || diverged(runs[base]) ? num(std::nan("")) : num(runs[v].val_loss - runs[base].val_loss);
  };
  Table t{"gpt_variants",
          fmt::format("4-bit ablation grid on the tiny GPT {}x{} ({} heads, T = {}, vocab {}, {} parameters) on fortunes, {} steps "
                      "of {} sequences, SGD lr {:g} momentum {:g}; the blocks' Linears in the variant, the rest fp32",
                      g.layers, g.width, g.heads, g.context, g.vocab, gpt_num_params(g), steps, plan.batch, plan.lr,
                      plan.momentum),
          {text_col("name", "variant"), float_col("train_loss", "train loss"), float_col("val_loss", "val loss"),
           float_col("val_gap_bf16", "val - bf16", "-", 3), float_col("val_gap_nvfp4", "val - nvfp4", "-", 3),
           sci_col("out_error", "out err", "-", 3), sci_col("dgrad_error", "dgrad err", "-", 3),
           sci_col("wgrad_error", "wgrad err", "-", 3)}};
  Table cost = cost_table("gpt_cost", "Tiny GPT: emulation cost per variant (run-dependent: timings; emulation in software, "
                                      "not a speed claim)");
  json history = json::object();
  for (const auto& v : variants) {
    const q::GptTrainRun& r = runs[v];
    auto& errors = gr.errors[v];
    t.rows.push_back({{"name", v}, {"train_loss", num(tail_mean(r))}, {"val_loss", num(r.val_loss)},
                      {"val_gap_bf16", gap("bf16", v)}, {"val_gap_nvfp4", gap("nvfp4", v)},
                      {"out_error", num(errors["out"])}, {"dgrad_error", num(errors["dgrad"])},
                      {"wgrad_error", num(errors["wgrad"])}, {"first_loss", num(r.loss.front())},
                      {"last_loss", num(r.loss.back())}});
    history[v] = loss_history(r.loss);
    cost.rows.push_back(cost_row(v, r.step_s, runs.at("fp32").step_s));
    if (!note_divergence(report, t, "gpt " + v, r.loss)) note_eval_divergence(report, t, "gpt " + v, "validation loss", r.val_loss);
  }
  t.notes.push_back(fmt::format("train loss: the mean of the last {} training losses; val loss: {} batch{} of the validation "
                                "split under the variant's forward; gaps: val loss - bf16's / - nvfp4's (null without it)",
                                last, plan.eval_batches, plan.eval_batches == 1 ? "" : "es"));
  t.notes.push_back("4-bit: the three GEMMs of the blocks' c_attn, attn_proj, c_fc, mlp_proj; the bf16 layers of the recipe: "
                    "the first (h0.c_attn) and the last (h<L-1>.mlp_proj) of them (nvfp4_no_bf16: those in 4 bits too); "
                    "embeddings, LayerNorm, softmax, attention's q·k^T and p·v, lm_head and the loss stay fp32 in every row");
  t.notes.push_back(fmt::format("errors: ||C - C_fp32|| / ||C_fp32|| of each GEMM at step {}, mean over the 4-bit Linears (all "
                                "of them for fp32 and bf16)", cfg.integer("/gpt/ledger_step")));
  mem.notes.push_back("as the MLP's memory table, for the block Linears only (x: the [tokens, in] activation; lm_head and "
                      "the embeddings stay fp32 and are not counted)");
  report.add(std::move(t));
  report.add(std::move(mem));
  report.add(loss_curve("gpt_loss_curve", fmt::format("Tiny GPT training loss every {} steps", cfg.integer("/gpt/log_every")),
                        variants, steps, cfg.integer("/gpt/log_every"), runs));
  report.results["gpt_history"] = history;
  report.add(std::move(cost), Store::TimingsByName);
}

/// The initial weights of every variant's MLP (W1, b1, W2, b2, ... as mlp(784, hidden, 10) builds
/// them after seeding with /seed; detached fp32 copies).
std::vector<torch::Tensor> initial_weights(const Config& cfg, const std::vector<int64_t>& w) {
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  std::vector<torch::Tensor> init;
  auto net = mlp(784, std::vector<int64_t>(w.begin() + 1, w.end() - 1), 10);
  for (auto& lin : linear_layers(net)) {
    init.push_back(lin->weight.detach().clone());
    init.push_back(lin->bias.detach().clone());
  }
  return init;
}

/// The MLP's runs and mean GEMM errors per variant.
struct MlpRuns {
  std::map<std::string, q::TrainRun> runs;
  std::map<std::string, std::map<std::string, double>> errors;
};

/// Trains the MLP under every variant of /variants from `init` on the same batches; fills `mem`
/// with each variant's stored bytes (every layer under its own recipe, as fp8's table).
MlpRuns train_mlp_variants(const Context& ctx, const std::vector<torch::Tensor>& init, const Dataset& train_set,
                           const Dataset& test_set, const std::vector<int64_t>& w, Table& mem) {
  const auto& cfg = ctx.cfg;
  const std::size_t L = w.size() - 1;
  const int64_t ledger_step = cfg.integer("/ledger/step");
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (std::size_t l = 0; l < L; ++l) dims.emplace_back(w[l], w[l + 1]);
  q::TrainPlan plan;
  plan.steps = cfg.integer("/train/steps");
  plan.batch = cfg.integer("/train/batch");
  plan.lr = cfg.number("/train/lr");
  plan.seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  plan.ledger_steps = {ledger_step};
  MlpRuns out;
  for (const auto& v : cfg.strings("/variants")) {
    q::QuantMlp n = q::make_quant_mlp(init, variant_recipes(v, L, plan.seed));
    const q::TrainRun& run = out.runs[v] = q::train(n, train_set, test_set, plan, ctx.tty, "fp4: " + v);
    std::vector<q::QuantRecipe> rs;
    for (std::size_t l = 0; l < L; ++l) rs.push_back(n.layers[l]->recipe());
    out.errors[v] = mean_gemm_errors(counted_layers(v, rs), [&](std::size_t l, const char* gemm) {
      return q::find_gemm(run.ledger[l], ledger_step, gemm);
    });
    mem.rows.push_back(memory_json(v, memory_row(rs, plan.batch, dims)));
  }
  return out;
}

/// The MLP tables' notes: what the variants and the errors are (variants), what is measured and
/// counted (memory).
void add_mlp_notes(const Config& cfg, Table& t, Table& mem) {
  t.notes.push_back("nvfp4: E2M1 1x16 blocks, UE4M3 scales under an fp32 tensor scale, 16x16 weight blocks, SR on dy, RHT on "
                    "wgrad, first and last Linear in bf16; each no_* variant drops one of these; mxfp4: E2M1 1x32, E8M0 FLOOR");
  t.notes.push_back(fmt::format("errors: ||C - C_fp32|| / ||C_fp32|| of each GEMM at step {}, mean over the 4-bit layers (all "
                                "layers for fp32 and bf16); the last Linear stays bf16 everywhere (10 outputs fit no 16-block)",
                                cfg.integer("/ledger/step")));
  mem.notes.push_back("measured: the same tensors allocated in LibTorch's own dtypes (fp32, bf16, float8_e4m3fn, "
                      "float8_e5m2, float4_e2m1fn_x2 two codes a byte; scales float8_e8m0fnu, UE4M3 as float8_e4m3fn) "
                      "and counted by mpt's CPU allocator (core/numerics/quant's measured_stored_bytes); \"-\" (null in the "
                      "result file) where this LibTorch lacks a dtype (1.13 has none; no LibTorch has FP6)");
  mem.notes.push_back("weights: the fp32 masters plus the quantized copies of W the GEMMs read (16x16 blocks: one copy "
                      "serves W and W^T; 1x16 / 1x32 blocks: a row-wise and a column-wise copy); activations: x saved for "
                      "the weight gradient in wgrad's format; gradients: fp32; scales: UE4M3 / E8M0 1 byte a block, plus "
                      "4 for an NVFP4 tensor scale (core/numerics/quant's stored_bytes; emulation itself holds fp32)");
}

/// The MLP section: the ablation grid on Fashion-MNIST. Adds tables variants, memory,
/// loss_curve, results.history and the timings table cost.
void mlp_section(const Context& ctx, const Dataset& train_set, const Dataset& test_set, Report& report) {
  const auto& cfg = ctx.cfg;
  const auto w = widths(cfg);
  const auto init = initial_weights(cfg, w);
  const int64_t steps = cfg.integer("/train/steps");
  const auto variants = cfg.strings("/variants");
  Table mem = memory_table("memory", fmt::format("Bytes stored per variant (computed at the formats' widths, and measured in "
                                                 "LibTorch's low-bit dtypes), batch {}", cfg.integer("/train/batch")));
  MlpRuns mr = train_mlp_variants(ctx, init, train_set, test_set, w, mem);
  auto& runs = mr.runs;
  // A gap to a diverged run (a training or test loss not finite) is nan, not a number that reads as a result.
  auto gap = [&](const std::string& base, const std::string& v, double q::Evaluation::*m = &q::Evaluation::loss) -> json {
    if (!runs.count(base)) return nullptr;
    return q::diverged(runs[v]) || q::diverged(runs[base]) ? num(std::nan("")) : num(runs[v].test.*m - runs[base].test.*m);
  };
  Table t{"variants",
          fmt::format("4-bit ablation grid: MLP {} on Fashion-MNIST, {} steps of {}, SGD lr {:g}", fmt::join(w, "-"), steps,
                      cfg.integer("/train/batch"), cfg.number("/train/lr")),
          {text_col("name", "variant"), float_col("test_loss", "test loss"), pct_col("test_accuracy", "test acc"),
           float_col("loss_gap_bf16", "loss - bf16", "-", 3), float_col("loss_gap_nvfp4", "loss - nvfp4", "-", 3),
           pct_col("accuracy_gap_bf16", "acc - bf16", 2), sci_col("out_error", "out err", "-", 3),
           sci_col("dgrad_error", "dgrad err", "-", 3), sci_col("wgrad_error", "wgrad err", "-", 3)}};
  Table cost = cost_table("cost", "Emulation cost per variant (run-dependent: timings; emulation in software, not a speed claim)");
  json history = json::object();
  for (const auto& v : variants) {
    const q::TrainRun& r = runs[v];
    auto& errors = mr.errors[v];
    t.rows.push_back({{"name", v}, {"test_loss", num(r.test.loss)}, {"test_accuracy", num(r.test.accuracy)},
                      {"loss_gap_bf16", gap("bf16", v)}, {"loss_gap_nvfp4", gap("nvfp4", v)},
                      {"accuracy_gap_bf16", gap("bf16", v, &q::Evaluation::accuracy)},
                      {"out_error", num(errors["out"])}, {"dgrad_error", num(errors["dgrad"])},
                      {"wgrad_error", num(errors["wgrad"])}, {"last_loss", num(r.loss.back())}});
    history[v] = loss_history(r.loss);
    cost.rows.push_back(cost_row(v, r.step_s, runs.at("fp32").step_s));  // validate_fp4: fp32 is among the variants
    // a loss that became nan or inf, and at which step; or a test loss that did after training
    if (!note_divergence(report, t, v, r.loss)) note_eval_divergence(report, t, v, "test loss", r.test.loss);
  }
  add_mlp_notes(cfg, t, mem);
  report.add(std::move(t));
  report.add(std::move(mem));
  report.add(loss_curve("loss_curve", fmt::format("Training loss every {} steps", cfg.integer("/train/log_every")), variants,
                        steps, cfg.integer("/train/log_every"), runs));
  report.results["history"] = history;
  report.add(std::move(cost), Store::TimingsByName);
}

Report run_fp4(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  Dataset train_set = load_fashion_mnist(cfg.str("/data/dir"), "train", cfg.integer("/data/train_samples"));
  Dataset test_set = load_fashion_mnist(cfg.str("/data/dir"), "test", cfg.integer("/data/test_samples"));
  mlp_section(ctx, train_set, test_set, report);
  if (cfg.boolean("/gpt/enabled")) {
    const double t0 = now_seconds();
    gpt_section(ctx, report);
    report.timings["gpt_s"] = now_seconds() - t0;
  }
  return report;
}

/// Memory of a run (core/runtime/memory): the Fashion-MNIST samples (784 floats and an int64 label each)
/// and one variant's training at a time (each variant's model is freed before the next): 6
/// parameter-sized fp32 tensors (the initial weights, the master leaves, their gradients, the
/// quantized copies of W, 2-D blocked and 1x16, that the out and dgrad GEMMs read, the SGD update's
/// temporary) and 8 per sample and unit (the Linear and ReLU outputs, x and dy with their
/// quantized and Hadamard-transformed copies for wgrad, the quantizer's fp32 temporaries), over a
/// training batch or a 1000-sample evaluation chunk. An estimate of the order of magnitude.
MemoryEstimate fp4_memory(const Config& cfg, int /*world_size*/) {
  const int64_t samples = cfg.integer("/data/train_samples");
  const int64_t rows = mlp_rows_at_once(cfg.integer("/train/batch"), samples, cfg.integer("/data/test_samples"));
  MemoryEstimate e;
  add_mlp_training(e, "MLP under a variant", widths(cfg), rows, 6, 8, "/model/hidden",
                   "/train/batch, /data/test_samples, /model/hidden");
  e.add("Fashion-MNIST images and labels", "/data/train_samples, /data/test_samples",
        fashion_mnist_bytes(samples + cfg.integer("/data/test_samples")));
  if (cfg.boolean("/gpt/enabled")) {  // one variant's GPT at a time, after the MLP's (as fp8's GPT section)
    const GptConfig g = gpt_config_at(cfg, kGptModel, 96);  // at most 96 characters (clean_fortune_text)
    e.add("tiny GPT parameters x 5 (weights, gradients, momentum, quantized copies)", "/gpt/model/width, /gpt/model/layers",
          5 * static_cast<double>(gpt_num_params(g)) * 4);
    e.add("tiny GPT activations (Korthikanti et al. 2022, fp32, with their quantized copies)",
          "/gpt/batch, /gpt/model/context, /gpt/model/width, /gpt/model/heads, /gpt/model/layers",
          gpt_activation_bytes(static_cast<double>(g.layers), static_cast<double>(g.context),
                               static_cast<double>(cfg.integer("/gpt/batch")), static_cast<double>(g.width),
                               static_cast<double>(g.heads), 96, /*copies=*/2));
  }
  return e;
}

}  // namespace

Experiment fp4_experiment() {
  return {"fp4", "4-bit training emulated bit for bit: the NVFP4 recipe, its ablations (SR, RHT, 2-D weights, bf16 layers), MXFP4",
          fp4_spec, run_fp4, validate_fp4, fp4_memory};
}

}  // namespace mpt
