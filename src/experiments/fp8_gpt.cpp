/*
 * mpt fp8, section 3 — the fp8 recipes on a tiny GPT (core/models/gpt) trained character-level on
 * Debian's fortunes (core/io/data), beside the MLP of sections 1 and 2.
 *
 * Which GEMMs are fp8: the four Linears of every block (attn.c_attn C→3C, attn.c_proj C→C,
 * mlp.c_fc C→4C, mlp.c_proj 4C→C), each with its three GEMMs (out = x·Wᵀ, dgrad = dy·W,
 * wgrad = dyᵀ·x) quantized as the recipe says (core/numerics/quant's QuantLinear through TinyGpt's
 * GptLinear). As Transformer Engine's fp8_autocast, which swaps only te.Linear's GEMMs, the
 * rest stays in higher precision — here fp32 in every row: the embeddings, LayerNorm, softmax,
 * attention's two batched matmuls (q·kᵀ, p·v), lm_head and the loss. So the rows differ only in
 * those GEMMs: fp32 runs them in fp32, bf16 casts their operands to bf16 (fp32 accumulation),
 * the fp8 recipes quantize them to E4M3 / E5M2 with the scales of sections 1 and 2.
 *
 * The GEMM operands are 2-D: x [B·T, C] (the [B, T, C] activation folded), W [out, in],
 * dy [B·T, out]; wgrad reduces over the B·T tokens. So every block size must divide C, 3C,
 * mlp_ratio·C and B·T (validate: exit 2 naming /blockwise/tile, /blockwise/weight_block or /mx/block).
 *
 * Every recipe starts from the same weights (torch.manual_seed(seed) before TinyGpt) and sees
 * the same batches (nanoGPT's get_batch from a generator seeded with seed); SGD with momentum
 * on fp32 weights (core/train/amp's SgdMomentum, as lossscale's GPT section).
 *
 * Rows: mean training loss of the last N steps, validation loss, their gaps to bf16; the GEMM
 * ledger at one step (amax, scale, % saturated, % flushed, error against the fp32 GEMM of the
 * same operands) for every fp8 recipe, Linear and GEMM; the loss curve.
 *
 *   mpt fp8 --config configs/fp8_gpt.json          # this section at 2 x 128, T = 64 (see docs/fp8.md)
 */
#include <algorithm>
#include <cmath>
#include <map>

#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/models/gpt.hpp"
#include "core/models/gpt_spec.hpp"
#include "core/numerics/quant.hpp"
#include "core/train/quant_train.hpp"
#include "core/runtime/runtime.hpp"
#include "experiments/fp8_parts.hpp"

namespace mpt::fp8 {

namespace {

namespace q = mpt::quant;

constexpr const char* kModel = "/gpt/model";

/// Tokens per step: the M of the out and dgrad GEMMs and the K of wgrad.
int64_t tokens_per_step(const Config& cfg) { return cfg.integer("/gpt/batch") * cfg.integer("/gpt/model/context"); }

/// The GPT's block Linears under `recipe` (fp32 and bf16: their own recipes; delayed: tensorwise
/// with TE's DelayedScaling on each Linear).
q::QuantGptLinears make_linears(const Config& cfg, const GptConfig& g, const std::string& recipe) {
  const q::QuantRecipe r = core_recipe(recipe, recipe_options(cfg));
  if (recipe != "delayed") return q::make_quant_gpt_linears(g, r);
  const q::DelayedScaling d = delayed_options(cfg);
  return q::make_quant_gpt_linears(g, r, &d);
}

}  // namespace

void add_gpt_spec(ConfigSpec& s) {
  s.boolean("/gpt/enabled", false,
            "train the tiny GPT under every recipe of /recipes (section 3; off by default: it does not fit the 60 s budget, "
            "see configs/fp8_gpt.json)");
  GptKeyDefaults d;
  d.layers = 2;
  d.width = 128;  // the blockwise 128 tiles and 128x128 weight blocks divide C, 3C and 4C
  d.heads = 4;
  d.context = 64;
  d.mlp_ratio = 4;
  add_gpt_keys(s, kModel, d);
  add_text_keys(s, "/gpt");
  s.integer("/gpt/batch", 16, "sequences per step (batch x context tokens: a multiple of the blocks, wgrad reduces over them)", 1,
            4096);
  s.integer("/gpt/steps", 100, "SGD steps per recipe", 1, 10'000'000);
  add_gpt_training_keys(s, "/gpt", 0.3, 0.9);
  s.integer("/gpt/ledger_step", 50, "training step (0-based) whose GEMMs the GPT's ledger shows", 0, 10'000'000);
  s.integer("/gpt/log_every", 10, "loss-curve sampling interval (steps)", 1, 10'000'000);
}

void validate_gpt(const Config& cfg) {
  if (!cfg.boolean("/gpt/enabled")) return;
  validate_gpt_keys(cfg, kModel, "/gpt");
  const int64_t steps = cfg.integer("/gpt/steps");
  if (cfg.integer("/gpt/ledger_step") >= steps)
    throw ConfigError(fmt::format("/gpt/ledger_step: expected a step below /gpt/steps = {}, got {}", steps,
                                  cfg.integer("/gpt/ledger_step")));
  // The vocabulary does not enter the four block Linears: any value builds their shapes.
  const GptConfig g = gpt_config_at(cfg, kModel, 1);
  const int64_t m = tokens_per_step(cfg);
  const q::RecipeOptions o = recipe_options(cfg);
  for (const auto& name : cfg.strings("/recipes")) {
    if (!is_fp8(name)) continue;
    const q::QuantRecipe r = core_recipe(name, o);
    for (const auto& lin : q::gpt_linear_shapes(g)) {
      const std::string err = q::shape_error(r, m, lin.in, lin.out);
      if (err.empty()) continue;
      throw ConfigError(fmt::format(
          "{}: recipe {} on the GPT's {} ({} -> {}, /gpt/batch x /gpt/model/context = {} tokens): {}; expected block sizes that "
          "divide /gpt/model/width = {} (and 3x, /gpt/model/mlp_ratio x it) and the tokens per step",
          block_key(name, o, m, lin.in, lin.out, "/gpt/model/width"), name, lin.name, lin.in, lin.out, m, err, g.width));
    }
  }
}

MemoryEstimate gpt_memory(const Config& cfg) {
  const GptConfig g = gpt_config_at(cfg, kModel, 96);  // at most 96 characters (clean_fortune_text)
  const double P = static_cast<double>(gpt_num_params(g));
  MemoryEstimate e;
  e.add("tiny GPT parameters x 5 (weights, gradients, momentum, quantized copies)", "/gpt/model/width, /gpt/model/layers",
        5 * P * 4);
  e.add("tiny GPT activations (Korthikanti et al. 2022, fp32, with their quantized copies)",
        "/gpt/batch, /gpt/model/context, /gpt/model/width, /gpt/model/heads, /gpt/model/layers",
        gpt_activation_bytes(static_cast<double>(g.layers), static_cast<double>(g.context),
                             static_cast<double>(cfg.integer("/gpt/batch")), static_cast<double>(g.width),
                             static_cast<double>(g.heads), 96, /*copies=*/2));
  return e;
}

namespace {

/// Trains the tiny GPT under every recipe of /recipes from the same weights (seeded before each)
/// on the same batches; `linear_names` receives the quantized Linears' names (the ledger's keys).
std::map<std::string, q::GptTrainRun> train_gpt_recipes(const Context& ctx, const TextCorpus& corpus, const GptConfig& g,
                                                        const q::GptTrainPlan& plan,
                                                        std::vector<std::string>& linear_names) {
  const auto& cfg = ctx.cfg;
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  std::map<std::string, q::GptTrainRun> runs;
  for (const auto& name : cfg.strings("/recipes")) {
    seed_all(seed);
    TinyGpt model(g);  // the same weights for every recipe; the QuantLinears draw after it
    q::QuantGptLinears lin = make_linears(cfg, g, name);
    linear_names = lin.names;
    runs[name] = q::train_gpt(model, lin, corpus, plan, ctx.tty, "fp8: gpt " + name);
  }
  return runs;
}

/// Table gpt_ledger: the out, dgrad and wgrad GEMMs of every quantized Linear of each fp8
/// recipe at /gpt/ledger_step.
Table gpt_ledger_table(const Config& cfg, const std::vector<std::string>& recipes,
                       const std::map<std::string, q::GptTrainRun>& runs, const std::vector<std::string>& linear_names) {
  const int64_t ledger_step = cfg.integer("/gpt/ledger_step");
  Table ledger{"gpt_ledger",
               fmt::format("Tiny GPT GEMM ledger at step {}: A and B operands (out: x, W; dgrad: dy, W^T; wgrad: dy^T, x^T), "
                           "x [{} tokens, in]", ledger_step, tokens_per_step(cfg)),
               ledger_columns()};
  for (const auto& name : recipes) {
    if (!is_fp8(name)) continue;
    const q::GptTrainRun& r = runs.at(name);
    for (const auto& lin : linear_names)
      for (const char* gemm : {"out", "dgrad", "wgrad"})
        if (const q::GemmLedger* e = q::find_gemm(r.ledger.at(lin), ledger_step, gemm))
          ledger.rows.push_back(ledger_row(fmt::format("{} / {} / {}", name, lin, gemm), name, lin, *e));
  }
  ledger.notes.push_back("scale: the s of q = cast(x·s) of the block with the largest amax (E8M0: 2^-e of the largest block "
                         "exponent); sat: elements clamped at the element max; ->0: nonzero elements quantized to 0; rel err: "
                         "||C - C_fp32|| / ||C_fp32|| against the fp32 GEMM of the same (unquantized) operands");
  return ledger;
}

/// Table gpt_loss_curve: one row every /gpt/log_every steps (from step 0), one column per recipe.
Table gpt_loss_curve(const Config& cfg, const std::vector<std::string>& recipes,
                     const std::map<std::string, q::GptTrainRun>& runs) {
  Table curve{"gpt_loss_curve", fmt::format("Tiny GPT training loss every {} steps", cfg.integer("/gpt/log_every")),
              {int_col("step", "step")}};
  for (const auto& name : recipes) curve.columns.push_back(float_col(name, name));
  for (int64_t s = 0; s < cfg.integer("/gpt/steps"); s += cfg.integer("/gpt/log_every")) {
    json row = {{"name", fmt::format("step{}", s)}, {"step", s}};
    for (const auto& name : recipes) row[name] = num(runs.at(name).loss[static_cast<std::size_t>(s)]);
    curve.rows.push_back(row);
  }
  return curve;
}

}  // namespace

// gpt_section (documented in fp8_parts.hpp): train, then the recipes table, the loss curve, the
// ledger and the cost table.
void gpt_section(const Context& ctx, Report& report) {
  const auto& cfg = ctx.cfg;
  const TextCorpus corpus = load_text_corpus_at(cfg, "/gpt");
  const GptConfig g = gpt_config_at(cfg, kModel, corpus.vocab());  // validate_gpt checked the split against the context
  const auto seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  const int64_t steps = cfg.integer("/gpt/steps");
  const int64_t last = std::min<int64_t>(cfg.integer("/gpt/mean_of_last"), steps);
  const auto recipes = cfg.strings("/recipes");
  const q::GptTrainPlan plan = q::gpt_train_plan_at(cfg, "/gpt", seed);

  std::vector<std::string> linear_names;
  std::map<std::string, q::GptTrainRun> runs = train_gpt_recipes(ctx, corpus, g, plan, linear_names);

  Table t{"gpt_recipes",
          fmt::format("fp8 recipes ({}) on the tiny GPT {}x{} ({} heads, T = {}, vocab {}, {} parameters) on fortunes, {} steps "
                      "of {} sequences, SGD lr {:g} momentum {:g}; the blocks' Linears in the recipe, the rest fp32",
                      cfg.str("/format"), g.layers, g.width, g.heads, g.context, g.vocab, gpt_num_params(g), steps, plan.batch,
                      plan.lr, plan.momentum),
          {text_col("name", "recipe"), float_col("train_loss", "train loss"), float_col("val_loss", "val loss"),
           float_col("train_gap_bf16", "train - bf16", "-", 4), float_col("val_gap_bf16", "val - bf16", "-", 4),
           float_col("last_loss", "last step loss")}};
  const bool have_bf16 = runs.count("bf16") > 0;
  auto tail_mean = [&](const q::GptTrainRun& r) {
    double sum = 0;
    for (std::size_t s = r.loss.size() - static_cast<std::size_t>(last); s < r.loss.size(); ++s) sum += r.loss[s];
    return sum / static_cast<double>(last);
  };
  Table cost{"gpt_cost", "Tiny GPT: emulation cost per recipe (run-dependent: timings; emulation in software, not a speed claim)",
             {text_col("name", "recipe"), float_col("step_ms", "step", "ms", 3), float_col("vs_fp32", "vs fp32", "x", 3)}};
  json history = json::object();
  for (const auto& name : recipes) {
    const q::GptTrainRun& r = runs[name];
    const double train = tail_mean(r);
    t.rows.push_back({{"name", name}, {"train_loss", num(train)}, {"val_loss", num(r.val_loss)},
                      {"train_gap_bf16", have_bf16 ? num(train - tail_mean(runs["bf16"])) : json(nullptr)},
                      {"val_gap_bf16", have_bf16 ? num(r.val_loss - runs["bf16"].val_loss) : json(nullptr)},
                      {"last_loss", num(r.loss.back())}});
    json h = json::array();
    for (double v : r.loss) h.push_back(num(v));
    history[name] = h;
    cost.rows.push_back({{"name", name}, {"step_ms", r.step_s * 1e3}, {"vs_fp32", r.step_s / runs["fp32"].step_s},
                         {"step_time_s", r.step_s}});
    if (!note_divergence(report, t, "gpt " + name, r.loss))
      note_eval_divergence(report, t, "gpt " + name, "validation loss", r.val_loss);
  }
  t.notes.push_back(fmt::format("train loss: the mean of the last {} training losses; val loss: {} batch{} of the validation "
                                "split under the recipe's forward (delayed: its last scales, no amax recorded); gaps: recipe - "
                                "bf16 (null without bf16)", last, plan.eval_batches, plan.eval_batches == 1 ? "" : "es"));
  t.notes.push_back("fp8 / bf16: the three GEMMs of the blocks' c_attn, attn_proj, c_fc and mlp_proj (TE's fp8_autocast "
                    "scope: te.Linear); the embeddings, LayerNorm, softmax, attention's q·k^T and p·v, lm_head and the loss "
                    "stay fp32 in every row");
  t.notes.push_back("delayed: " + fmt::format("amax_history_len {}, margin {}, amax_compute_algo {}, one history per Linear and "
                                              "role (x, W, dy)", cfg.integer("/delayed/amax_history_len"),
                                              cfg.integer("/delayed/margin"), cfg.str("/delayed/amax_compute_algo")));

  report.add(std::move(t));
  report.add(gpt_loss_curve(cfg, recipes, runs));
  if (Table ledger = gpt_ledger_table(cfg, recipes, runs, linear_names); !ledger.rows.empty())
    report.add(std::move(ledger));
  report.results["gpt_history"] = history;
  report.add(std::move(cost), Store::TimingsByName);
}

}  // namespace mpt::fp8
