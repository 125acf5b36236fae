/*
 * mpt fp8 — fp8 training recipes, emulated bit for bit on the CPU (core/numerics/quant), on the
 * Fashion-MNIST MLP of the mixed-precision lessons.
 *
 * Every recipe trains the same MLP (core/models/mlp' mlp(784, hidden, 10), one seed) on the same
 * batches with plain SGD. A quantized Linear layer runs its three GEMMs (out = x·Wᵀ,
 * dgrad = dy·W, wgrad = dyᵀ·x) on quantize-dequantized operands and accumulates in fp32:
 *
 *   fp32         no quantization (the reference)
 *   bf16         every GEMM operand cast to bf16 (torch.autocast)
 *   tensorwise   one fp32 scale per tensor from its own amax: s = fp8_max / amax (torchao
 *                TENSORWISE, TE Float8CurrentScaling); q = cast(clamp(x·s)), x̂ = q / s
 *   delayed      the same, but s comes from the amax history of the steps before this one:
 *                s = (fp8_max / max(history)) / 2^margin, or the most recent amax (TE DelayedScaling)
 *   rowwise      one power-of-two scale per row along the reduction dim (torchao ROWWISE)
 *   blockwise    1x128 activation / gradient tiles, 128x128 weight blocks (DeepSeek-V3 §3.3)
 *   mxfp8        1x32 blocks, E8M0 scales, torchao's RCEIL rule (OCP MX v1.0)
 *   mxfp8_floor  the same with the OCP spec's FLOOR rule, which can clip a block's max
 *
 * Element format: E4M3 everywhere, or HYBRID (E4M3 forward, E5M2 for the gradient dy).
 * Layers: by default the first and the last Linear stay bf16 (784 and 10 divide no 32 or 128
 * block; torchao and TE skip such layers too); model.fp8_layers = "all" quantizes every one.
 *
 * Tables: final loss and test accuracy per recipe and the gap to bf16; the GEMM ledger at one
 * step (amax, scale, % saturated, % flushed to zero, error against the fp32 GEMM); an outlier
 * batch (inputs × factor) under current and delayed scaling, step by step; MXFP8 saturation per
 * 1x32 block under FLOOR and RCEIL on the same fp32 operands; the limited-precision accumulator
 * at K = 4096 without and with promotion every N_C = 128 (DeepSeek-V3 §3.3.2); the bytes each
 * recipe stores. Times (emulated step / fp32 step) go to timings: emulation cost, no speed claim.
 * The MX and accumulator sections live in src/experiments/fp8_blocks.cpp.
 *
 * Section 3 (gpt.enabled, off by default: src/experiments/fp8_gpt.cpp): the same recipes on the
 * tiny GPT's block Linears (c_attn, attn_proj, c_fc, mlp_proj), the rest of the GPT in fp32.
 *
 * The tensorwise recipe equals a PyTorch-Python twin that quantizes with torch.float8_e4m3fn /
 * float8_e5m2 casts, step for step (tests/parity/fp8_ref.py).
 *
 *   mpt fp8
 *   mpt fp8 --set format=e4m3 --set "recipes=[\"fp32\",\"tensorwise\",\"delayed\"]"
 *   mpt fp8 --set delayed.amax_history_len=4 --set outlier.factor=100
 *   mpt fp8 --config configs/fp8_gpt.json          # with section 3, the tiny GPT 2 x 128
 */
#include <algorithm>
#include <cmath>
#include <map>

#include "core/io/data.hpp"
#include "core/errors.hpp"
#include "core/models/mlp.hpp"
#include "core/numerics/quant.hpp"
#include "core/train/quant_train.hpp"
#include "core/runtime/runtime.hpp"
#include "core/experiment.hpp"
#include "experiments/fp8_parts.hpp"

namespace mpt {

namespace fp8 {

namespace q = mpt::quant;

bool is_fp8(const std::string& r) { return r != "fp32" && r != "bf16"; }

q::RecipeOptions recipe_options(const Config& cfg) {
  q::RecipeOptions o;
  o.tile = cfg.integer("/blockwise/tile");
  o.weight_block = cfg.integer("/blockwise/weight_block");
  o.mx_block = cfg.integer("/mx/block");
  o.grad_element = cfg.str("/format") == "hybrid" ? q::Element::E5M2 : q::Element::E4M3;
  return o;
}

q::QuantRecipe core_recipe(const std::string& name, const q::RecipeOptions& o) {
  q::QuantRecipe r = q::recipe(name == "delayed" ? "tensorwise" : name, name == "fp32" || name == "bf16" ? q::RecipeOptions{} : o);
  r.name = name;
  return r;
}

q::DelayedScaling delayed_options(const Config& cfg) {
  q::DelayedScaling d;
  d.amax_history_len = cfg.integer("/delayed/amax_history_len");
  d.margin = static_cast<int>(cfg.integer("/delayed/margin"));
  d.amax_compute_algo = q::parse_amax_compute_algo(cfg.str("/delayed/amax_compute_algo"));
  return d;
}

std::string block_key(const std::string& name, const q::RecipeOptions& o, int64_t m, int64_t k, int64_t n,
                      const std::string& other) {
  if (name == "blockwise") {  // which of its two block sizes fails
    q::RecipeOptions tile_only = o;
    tile_only.weight_block = 1;
    return q::shape_error(core_recipe(name, tile_only), m, k, n).empty() ? "/blockwise/weight_block" : "/blockwise/tile";
  }
  return name.rfind("mxfp8", 0) == 0 ? "/mx/block" : other;
}

std::vector<Column> ledger_columns() {
  return {text_col("name", "recipe / layer / GEMM"), sci_col("a_amax", "A amax", "-", 3), sci_col("a_scale", "A scale", "-", 3),
          pct_col("a_saturated", "A sat", 3), pct_col("a_flushed", "A ->0", 3), sci_col("b_amax", "B amax", "-", 3),
          sci_col("b_scale", "B scale", "-", 3), pct_col("b_saturated", "B sat", 3), pct_col("b_flushed", "B ->0", 3),
          sci_col("rel_error", "rel err", "-", 3)};
}

namespace {
json operand_json(const q::OperandLedger& o) {
  return {{"amax", num(o.amax)}, {"scale_min", num(o.scale_min)}, {"scale_max", num(o.scale_max)},
          {"saturated", num(o.saturated_frac)}, {"flushed", num(o.flushed_frac)}};
}
}  // namespace

json ledger_row(const std::string& name, const std::string& recipe, const json& layer, const q::GemmLedger& g) {
  // scale as x ≈ q·scale; for per-tensor fp32 scales report s of x·s (TE / torchao's scale): 1/scale.
  auto sc = [](const q::OperandLedger& op) { return op.scale_max > 0 ? num(1.0 / op.scale_max) : json(nullptr); };
  return {{"name", name}, {"recipe", recipe}, {"layer", layer}, {"gemm", g.gemm},
          {"a_amax", num(g.a.amax)}, {"a_scale", sc(g.a)}, {"a_saturated", num(g.a.saturated_frac)},
          {"a_flushed", num(g.a.flushed_frac)}, {"b_amax", num(g.b.amax)}, {"b_scale", sc(g.b)},
          {"b_saturated", num(g.b.saturated_frac)}, {"b_flushed", num(g.b.flushed_frac)},
          {"rel_error", num(g.rel_error)}, {"a", operand_json(g.a)}, {"b", operand_json(g.b)}};
}

}  // namespace fp8

namespace {

namespace q = mpt::quant;
using fp8::core_recipe;
using fp8::delayed_options;
using fp8::is_fp8;
using fp8::layer_name;
using fp8::recipe_options;

const std::vector<std::string> kRecipes = {"fp32", "bf16", "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "mxfp8_floor"};

ConfigSpec fp8_spec() {
  ConfigSpec s;
  s.integer("/seed", 0, "seed before building the model (torch.manual_seed); data order and the accumulator inputs derive from it", 0);
  s.string("/data/dir", kFashionMnistDir, "folder with the Fashion-MNIST IDX .gz files");
  s.integer("/data/train_samples", 10000, "training samples used (first N of the 60000)", 1, 60000);
  s.integer("/data/test_samples", 1000, "test samples used (first N of the 10000)", 1, 10000);
  s.integers("/model/hidden", {256, 256, 256}, "hidden widths of the MLP 784 - hidden... - 10", 1, 8192);
  s.choice("/model/fp8_layers", "inner", {"inner", "all"},
           "inner: the first and last Linear stay bf16 (their 784 inputs and 10 outputs divide no block); all: every Linear "
           "is quantized (every dimension must then divide the recipes' blocks)");
  s.strings("/recipes", kRecipes, kRecipes, "recipes to train (fp32 is required: the reference of the timings and the MX table)");
  s.choice("/format", "hybrid", {"hybrid", "e4m3"}, "hybrid: E4M3 for x and W, E5M2 for the gradient dy (TE's HYBRID); e4m3: E4M3 everywhere");
  s.integer("/train/steps", 200, "SGD steps per recipe", 1, 1'000'000);
  s.integer("/train/batch", 128, "samples per step (a multiple of the blocks: wgrad reduces over it)", 1, 60000);
  s.number("/train/lr", 0.1, "SGD learning rate", 0.0, 100.0);
  s.integer("/train/log_every", 50, "loss-curve sampling interval (steps)", 1, 1'000'000);
  s.integer("/delayed/amax_history_len", 16, "TE DelayedScaling.amax_history_len (TE: 1024; >= 1)", 1, 1'000'000);
  s.integer("/delayed/margin", 0, "TE DelayedScaling.margin: scale = (fp8_max / amax) / 2^margin", 0, 64);
  s.choice("/delayed/amax_compute_algo", "max", {"max", "most_recent"}, "TE DelayedScaling.amax_compute_algo");
  s.integer("/blockwise/tile", 128, "blockwise: activation and gradient tiles 1 x tile (DeepSeek-V3: 128)", 1, 8192);
  s.integer("/blockwise/weight_block", 128, "blockwise: weight blocks B x B (DeepSeek-V3: 128)", 1, 8192);
  s.integer("/mx/block", 32, "mxfp8: 1 x block elements share an E8M0 scale (OCP MX v1.0: 32)", 1, 8192);
  s.integer("/ledger/step", 100, "training step (0-based) whose GEMMs the ledger and the MX table show", 0, 1'000'000);
  s.boolean("/outlier/enabled", true, "run the outlier section (tensorwise current vs delayed scaling)");
  s.integer("/outlier/step", 20, "step (0-based) whose batch is multiplied by the factor", 0, 1'000'000);
  s.number("/outlier/factor", 1000.0, "factor on that batch's inputs", 1e-30, 1e30);
  s.boolean("/outlier/skip_update", true,
            "skip the outlier batch's SGD update (its forward and backward run and its amaxes enter the history), so the "
            "table isolates the scaling; false: every variant trains on it (at lr 0.1 the x factor diverges even fp32)");
  s.integer("/outlier/after", 4, "steps shown after the outlier's history has passed", 0, 1000);
  s.integer("/accumulator/k", 4096, "reduction length K of the accumulator GEMM", 1, 1 << 20);
  s.integer("/accumulator/m", 16, "rows of A (outputs m x n)", 1, 4096);
  s.integer("/accumulator/n", 16, "rows of Bt", 1, 4096);
  s.integer("/accumulator/significand_bits", 14, "accumulator significand bits (DeepSeek-V3: about 14 on H800)", 1, 24);
  s.integer("/accumulator/chunk", 4, "products summed in fp32 before each accumulator add (Fasi et al.: 4)", 1, 4096);
  s.integer("/accumulator/promote_every", 128, "N_C: promotion to fp32 every N_C elements of K (DeepSeek-V3: 128)", 1, 1 << 20);
  fp8::add_gpt_spec(s);  // the tiny GPT section (fp8_gpt.cpp)
  return s;
}


/// Layer widths 784, hidden..., 10.
std::vector<int64_t> widths(const Config& cfg) {
  std::vector<int64_t> w{784};
  for (long long h : cfg.integers("/model/hidden")) w.push_back(h);
  w.push_back(10);
  return w;
}
bool layer_is_fp8(const Config& cfg, std::size_t layer, std::size_t layers) {
  return cfg.str("/model/fp8_layers") == "all" || (layer > 0 && layer + 1 < layers);
}

/// Cross-key checks before any work (exit 2): fp32 among the recipes, every fp8 layer's GEMM
/// operands divisible by the recipes' blocks, the ledger and outlier steps inside the run.
void validate_fp8(const Config& cfg, int /*world_size*/) {
  const auto recipes = cfg.strings("/recipes");
  if (std::find(recipes.begin(), recipes.end(), "fp32") == recipes.end())
    throw ConfigError("/recipes: expected a list containing \"fp32\" (the reference of the timings and of the MX table), got " +
                      cfg.json_value()["recipes"].dump());
  const auto w = widths(cfg);
  // A step takes min(/train/batch, /data/train_samples) samples (run_fp8: fewer samples than a batch make one batch).
  const int64_t batch = cfg.integer("/train/batch"), samples = cfg.integer("/data/train_samples");
  const int64_t m = std::min(batch, samples);
  const q::RecipeOptions o = recipe_options(cfg);
  // With one hidden layer, "inner" leaves no Linear in fp8: every fp8 recipe would be bf16.
  if (w.size() < 4 && cfg.str("/model/fp8_layers") == "inner")
    throw ConfigError(fmt::format("/model/fp8_layers: \"inner\" keeps the first and last Linear in bf16, which with "
                                  "/model/hidden = {} leaves no layer in fp8; expected \"all\", or at least two hidden layers",
                                  cfg.json_value()["model"]["hidden"].dump()));
  for (const auto& name : recipes) {
    if (!is_fp8(name)) continue;
    const q::QuantRecipe r = core_recipe(name, o);
    for (std::size_t l = 0; l + 1 < w.size(); ++l) {
      if (!layer_is_fp8(cfg, l, w.size() - 1)) continue;
      const std::string err = q::shape_error(r, m, w[l], w[l + 1]);
      if (!err.empty() && m < batch && q::shape_error(r, batch, w[l], w[l + 1]).empty())
        throw ConfigError(fmt::format("/data/train_samples: expected at least /train/batch = {} (with fewer samples than "
                                      "a batch a step takes all {}: recipe {} on layer {}, {} -> {}: {}), got {}",
                                      batch, samples, name, l + 1, w[l], w[l + 1], err, samples));
      const std::string key = fp8::block_key(name, o, m, w[l], w[l + 1], "/model/fp8_layers");
      if (!err.empty())
        throw ConfigError(fmt::format("{}: recipe {} on layer {} ({} -> {}, batch /train/batch = {}): {}; expected block sizes "
                                      "that divide /model/hidden, /train/batch and (with /model/fp8_layers = \"all\") 784 and 10",
                                      key, name, l + 1, w[l], w[l + 1], m, err));
    }
  }
  const int64_t steps = cfg.integer("/train/steps");
  if (cfg.integer("/ledger/step") >= steps)
    throw ConfigError(fmt::format("/ledger/step: expected a step below /train/steps = {}, got {}", steps, cfg.integer("/ledger/step")));
  if (cfg.integer("/accumulator/promote_every") % cfg.integer("/accumulator/chunk") != 0)
    throw ConfigError(fmt::format("/accumulator/promote_every: expected a multiple of /accumulator/chunk = {}, got {}",
                                  cfg.integer("/accumulator/chunk"), cfg.integer("/accumulator/promote_every")));
  fp8::validate_gpt(cfg);
  require_fashion_mnist(cfg.str("/data/dir"), "/data/dir", /*with_test=*/true);
}

// ----------------------------------------------------------------------------
// Training
// ----------------------------------------------------------------------------

/// The MLP under `recipe`: fp8 layers per model.fp8_layers, the others bf16 (all fp32 for "fp32");
/// "delayed" switches the fp8 layers to TE's delayed scaling.
q::QuantMlp make_net(const Config& cfg, const std::vector<torch::Tensor>& init, const std::string& recipe,
                     std::vector<bool>* fp8_layers = nullptr) {
  const std::size_t L = init.size() / 2;
  const q::RecipeOptions o = recipe_options(cfg);
  std::vector<q::QuantRecipe> recipes;
  std::vector<bool> fp8(L);
  for (std::size_t l = 0; l < L; ++l) {
    fp8[l] = is_fp8(recipe) && layer_is_fp8(cfg, l, L);
    recipes.push_back(core_recipe(fp8[l] ? recipe : recipe == "fp32" ? "fp32" : "bf16", o));
  }
  q::QuantMlp n = q::make_quant_mlp(init, recipes);
  for (std::size_t l = 0; l < L; ++l)
    if (fp8[l] && recipe == "delayed") n.layers[l]->set_delayed_scaling(delayed_options(cfg));
  if (fp8_layers) *fp8_layers = fp8;
  return n;
}

q::TrainPlan base_plan(const Config& cfg) {
  q::TrainPlan p;
  p.steps = cfg.integer("/train/steps");
  p.batch = cfg.integer("/train/batch");
  p.lr = cfg.number("/train/lr");
  p.seed = static_cast<std::uint64_t>(cfg.integer("/seed"));
  return p;
}

// ----------------------------------------------------------------------------
// Sections
// ----------------------------------------------------------------------------

/// The outlier: tensorwise current scaling against delayed scaling (both amax algorithms), step by step.
void outlier_section(const Context& ctx, const std::vector<torch::Tensor>& init, const Dataset& tr, const Dataset& te,
                     const std::vector<int64_t>& w, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t at = cfg.integer("/outlier/step"), len = cfg.integer("/delayed/amax_history_len");
  const int64_t first = std::max<int64_t>(0, at - 2), last = at + len + cfg.integer("/outlier/after");
  // The first fp8 layer: its x is the first input the outlier reaches in fp8.
  std::size_t layer = 0;
  while (layer + 1 < w.size() - 1 && !layer_is_fp8(cfg, layer, w.size() - 1)) ++layer;
  q::TrainPlan plan = base_plan(cfg);
  plan.steps = last + 1;
  plan.outlier_step = at;
  plan.outlier_factor = cfg.number("/outlier/factor");
  plan.skip_outlier_update = cfg.boolean("/outlier/skip_update");
  plan.evaluate = false;
  for (int64_t s = first; s <= last; ++s) plan.ledger_steps.push_back(s);
  struct Variant {
    std::string key, label;
    std::optional<q::AmaxComputeAlgo> algo;
  };
  const std::vector<Variant> variants = {{"current", "current", std::nullopt},
                                         {"delayed_max", "delayed max", q::AmaxComputeAlgo::Max},
                                         {"delayed_recent", "delayed most_recent", q::AmaxComputeAlgo::MostRecent}};
  std::vector<q::TrainRun> runs;
  for (const auto& v : variants) {
    std::vector<bool> fp8;
    q::QuantMlp n = make_net(cfg, init, "tensorwise", &fp8);
    if (v.algo) {
      q::DelayedScaling d = delayed_options(cfg);
      d.amax_compute_algo = *v.algo;
      for (std::size_t l = 0; l < n.layers.size(); ++l)
        if (fp8[l]) n.layers[l]->set_delayed_scaling(d);
    }
    runs.push_back(q::train(n, tr, te, plan, ctx.tty, "fp8: outlier, " + v.label));
  }
  Table t{"outlier",
          fmt::format("Outlier: step {}'s inputs x {:g}; {} x operand of the out GEMM, tensorwise current vs delayed scaling "
                      "(history {}, margin {})", at, plan.outlier_factor, layer_name(layer, w), len, cfg.integer("/delayed/margin")),
          {int_col("step", "step")}};
  for (const auto& v : variants) {
    t.columns.push_back(pct_col(v.key + "_saturated", v.label + " sat", 2));
    t.columns.push_back(pct_col(v.key + "_flushed", "->0", 2));
    t.columns.push_back(sci_col(v.key + "_rel_error", "err", "-", 2));
  }
  t.columns.push_back(sci_col("delayed_max_scale", "dmax s", "-", 3));
  t.columns.push_back(float_col("current_loss", "loss cur"));
  t.columns.push_back(float_col("delayed_max_loss", "loss dmax"));
  for (int64_t s = first; s <= last; ++s) {
    json row = {{"name", fmt::format("step{}", s)}, {"step", s}};
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const q::GemmLedger* g = q::find_gemm(runs[i].ledger[layer], s, "out");
      row[variants[i].key + "_saturated"] = g ? num(g->a.saturated_frac) : json(nullptr);
      row[variants[i].key + "_flushed"] = g ? num(g->a.flushed_frac) : json(nullptr);
      row[variants[i].key + "_rel_error"] = g ? num(g->rel_error) : json(nullptr);
      row[variants[i].key + "_scale"] = g ? num(1.0 / g->a.scale_max) : json(nullptr);  // s of x·s
      row[variants[i].key + "_loss"] = num(runs[i].loss[static_cast<std::size_t>(s)]);
    }
    t.rows.push_back(row);
  }
  t.notes.push_back("sat: elements of x clamped at the fp8 max; ->0: nonzero elements quantized to 0; err: ||C - C_fp32|| / ||C_fp32|| "
                    "of the layer's out GEMM");
  t.notes.push_back(fmt::format("current scaling takes s from this batch's own amax, so the outlier step itself fits; delayed "
                                "scaling uses the history of earlier steps, so at the outlier it saturates; while the outlier's "
                                "amax stays in the history ('max': {} steps; 'most_recent': 1) the scale is about 1/factor of "
                                "normal and moves the normal batches' values log2(factor) binades down the fp8 grid: those below "
                                "the smallest subnormal flush (->0), the others keep fp8's relative precision until they reach "
                                "the subnormals", len));
  t.notes.push_back("dmax s: the delayed ('max') scale s of q = cast(x·s) each step; current's is fp8_max / amax of the batch");
  for (std::size_t i = 0; i < variants.size(); ++i) note_divergence(report, t, "outlier " + variants[i].label, runs[i].loss);
  report.add(std::move(t));
}

/// The initial weights of every recipe's MLP (W1, b1, W2, b2, ... as mlp(784, hidden, 10) builds
/// them after seeding with /seed; detached fp32 copies).
std::vector<torch::Tensor> initial_weights(const Config& cfg, const std::vector<int64_t>& w) {
  seed_all(static_cast<std::uint64_t>(cfg.integer("/seed")));
  std::vector<torch::Tensor> init;
  std::vector<int64_t> hidden(w.begin() + 1, w.end() - 1);
  auto net = mlp(784, hidden, 10);
  for (auto& lin : linear_layers(net)) {
    init.push_back(lin->weight.detach().clone());
    init.push_back(lin->bias.detach().clone());
  }
  return init;
}

/// The recipes table's header (rows: one per recipe).
Table recipes_table(const Config& cfg, const std::vector<int64_t>& w, int64_t batch) {
  return {"recipes",
          fmt::format("fp8 recipes ({}): MLP {} on Fashion-MNIST, {} steps of {}, SGD lr {:g}; {} layers in fp8", cfg.str("/format"),
                      fmt::join(w, "-"), cfg.integer("/train/steps"), batch, cfg.number("/train/lr"),
                      cfg.str("/model/fp8_layers") == "all" ? std::string("all") : std::string("inner (first, last: bf16)")),
          {text_col("name", "recipe"), float_col("test_loss", "test loss"), pct_col("test_accuracy", "test acc"),
           float_col("loss_gap_bf16", "loss - bf16", "-", 3), pct_col("accuracy_gap_bf16", "acc - bf16", 2),
           float_col("last_loss", "last step loss")}};
}

/// The GEMM ledger at /ledger/step, with its notes (rows: add_ledger_rows).
Table ledger_table(int64_t ledger_step) {
  Table ledger{"ledger",
               fmt::format("GEMM ledger at step {}: A and B operands (out: x, W; dgrad: dy, W^T; wgrad: dy^T, x^T)", ledger_step),
               fp8::ledger_columns()};
  ledger.notes.push_back("scale: the s of q = cast(x·s) (TE / torchao's scale) of the block with the largest amax, i.e. the "
                         "smallest s over the blocks (E8M0: 2^-e of the largest block exponent; bf16: 1)");
  ledger.notes.push_back("sat: elements clamped at the element max; ->0: nonzero elements quantized to 0; rel err: "
                         "||C - C_fp32|| / ||C_fp32|| against the fp32 GEMM of the unquantized operands");
  return ledger;
}

/// The bytes each recipe stores, with its notes (rows: memory_row).
Table memory_table(int64_t batch) {
  Table mem{"memory", fmt::format("Bytes stored per recipe (computed at the formats' widths, and measured in LibTorch's low-bit dtypes), batch {}", batch),
            {text_col("name", "recipe"), int_col("weights", "weights", "bytes"), int_col("activations", "activations", "bytes"),
             int_col("gradients", "gradients", "bytes"), int_col("scales", "scales", "bytes"), int_col("total", "total", "bytes"),
             int_col("measured", "measured", "bytes")}};
  mem.notes.push_back("measured: the same tensors allocated in LibTorch's own dtypes (fp32, bf16, float8_e4m3fn, "
                      "float8_e5m2, float4_e2m1fn_x2 two codes a byte; scales float8_e8m0fnu, UE4M3 as float8_e4m3fn) "
                      "and counted by mpt's CPU allocator (core/numerics/quant's measured_stored_bytes); \"-\" (null in the "
                      "result file) where this LibTorch lacks a dtype (1.13 has none; no LibTorch has FP6)");
  mem.notes.push_back("weights: fp32 master W, b plus the quantized copies the GEMMs read (two for rowwise and MX: row- and "
                      "column-wise); activations: x kept for wgrad in its format; gradients: fp32; scales: every stored "
                      "quantized tensor's scales (fp32 4 bytes, E8M0 1)");
  return mem;
}

/// The ledger rows of recipe `name`: the out, dgrad and wgrad GEMMs of each fp8 layer at `ledger_step`.
void add_ledger_rows(Table& ledger, const std::string& name, const q::TrainRun& r, const std::vector<bool>& fp8,
                     const std::vector<int64_t>& w, int64_t ledger_step) {
  for (std::size_t l = 0; l + 1 < w.size(); ++l) {
    if (!fp8[l]) continue;
    const q::GemmLedger* gs[] = {q::find_gemm(r.ledger[l], ledger_step, "out"), q::find_gemm(r.ledger[l], ledger_step, "dgrad"),
                                 q::find_gemm(r.ledger[l], ledger_step, "wgrad")};
    for (const q::GemmLedger* g : gs) {
      if (!g) continue;
      ledger.rows.push_back(fp8::ledger_row(fmt::format("{} / {} / {}", name, layer_name(l, w), g->gemm), name, l + 1, *g));
    }
  }
}

/// The memory row of recipe `name`: every layer of `n` under its own recipe (fp8 or the bf16 of
/// the edges), computed at the formats' widths and measured (null where a dtype is missing).
json memory_row(const std::string& name, const q::QuantMlp& n, const std::vector<int64_t>& w, int64_t batch) {
  q::StoredBytes total, measured;
  bool measurable = true;
  for (std::size_t l = 0; l + 1 < w.size(); ++l) {
    if (const auto mb = q::measured_stored_bytes(n.layers[l]->recipe(), batch, w[l], w[l + 1])) {
      measured.weights += mb->weights;
      measured.activations += mb->activations;
      measured.gradients += mb->gradients;
      measured.scales += mb->scales;
    } else {
      measurable = false;
    }
    const q::StoredBytes b = q::stored_bytes(n.layers[l]->recipe(), batch, w[l], w[l + 1]);
    total.weights += b.weights;
    total.activations += b.activations;
    total.gradients += b.gradients;
    total.scales += b.scales;
  }
  return {{"name", name}, {"weights", total.weights}, {"activations", total.activations},
          {"gradients", total.gradients}, {"scales", total.scales},
          {"total", total.weights + total.activations + total.gradients + total.scales},
          {"measured", measurable ? json(measured.weights + measured.activations + measured.gradients + measured.scales)
                                  : json(nullptr)},
          {"measured_parts", measurable ? json{{"weights", measured.weights},
                                               {"activations", measured.activations},
                                               {"gradients", measured.gradients},
                                               {"scales", measured.scales}}
                                        : json(nullptr)}};
}

/// The loss curve: one row every /train/log_every steps (from step 0), one column per recipe.
Table loss_curve_table(const Config& cfg, const std::vector<std::string>& recipes,
                       std::map<std::string, q::TrainRun>& runs) {
  Table curve{"loss_curve", fmt::format("Training loss every {} steps", cfg.integer("/train/log_every")), {int_col("step", "step")}};
  for (const auto& name : recipes) curve.columns.push_back(float_col(name, name));
  for (int64_t s = 0; s < cfg.integer("/train/steps"); s += cfg.integer("/train/log_every")) {
    json row = {{"name", fmt::format("step{}", s)}, {"step", s}};
    for (const auto& name : recipes) row[name] = num(runs[name].loss[static_cast<std::size_t>(s)]);
    curve.rows.push_back(row);
  }
  return curve;
}

/// The recipes table's rows (gaps to bf16), the cost rows and the divergence notes; returns
/// results.history (each recipe's training losses).
json add_recipe_rows(Report& report, Table& t, Table& cost, const std::vector<std::string>& recipes,
                     std::map<std::string, q::TrainRun>& runs) {
  const bool have_bf16 = runs.count("bf16") > 0;
  // A gap to a diverged run (a training or test loss not finite) is nan, not a number that reads as a result.
  auto gap = [&](const q::TrainRun& r, double q::Evaluation::*m) -> json {
    if (!have_bf16) return nullptr;
    const q::TrainRun& b = runs["bf16"];
    return q::diverged(r) || q::diverged(b) ? num(std::nan("")) : num(r.test.*m - b.test.*m);
  };
  json history = json::object();
  for (const auto& name : recipes) {
    const q::TrainRun& r = runs[name];
    t.rows.push_back({{"name", name}, {"test_loss", num(r.test.loss)}, {"test_accuracy", num(r.test.accuracy)},
                      {"loss_gap_bf16", gap(r, &q::Evaluation::loss)},
                      {"accuracy_gap_bf16", gap(r, &q::Evaluation::accuracy)},
                      {"last_loss", num(r.loss.back())}});
    json h = json::array();
    for (double v : r.loss) h.push_back(num(v));
    history[name] = h;
    cost.rows.push_back({{"name", name}, {"step_ms", r.step_s * 1e3}, {"vs_fp32", r.step_s / runs["fp32"].step_s},
                         {"step_time_s", r.step_s}});
    // a loss that became nan or inf, and at which step; or a test loss that did after training
    if (!note_divergence(report, t, name, r.loss)) note_eval_divergence(report, t, name, "test loss", r.test.loss);
  }
  return history;
}

/// Every recipe's training run (for the outlier and MX sections) and the cost table (added last,
/// under timings).
struct RecipeRuns {
  std::map<std::string, q::TrainRun> runs;
  Table cost;
};

/// Section 1: trains the MLP under each recipe of /recipes from the same initial weights; adds
/// tables recipes, loss_curve, ledger (when an fp8 layer has GEMMs at /ledger/step) and memory,
/// and results.history.
RecipeRuns recipes_section(const Context& ctx, const std::vector<torch::Tensor>& init, const Dataset& train_set,
                           const Dataset& test_set, const std::vector<int64_t>& w, Report& report) {
  const auto& cfg = ctx.cfg;
  const int64_t ledger_step = cfg.integer("/ledger/step");
  const int64_t batch = std::min<int64_t>(cfg.integer("/train/batch"), train_set.size());
  const auto recipes = cfg.strings("/recipes");
  Table ledger = ledger_table(ledger_step), mem = memory_table(batch);
  RecipeRuns out{{},
                 {"cost", "Emulation cost per recipe (run-dependent: timings; emulation in software, not a speed claim)",
                  {text_col("name", "recipe"), float_col("step_ms", "step", "ms", 3), float_col("vs_fp32", "vs fp32", "x", 3)}}};
  for (const auto& name : recipes) {
    std::vector<bool> fp8;
    q::QuantMlp n = make_net(cfg, init, name, &fp8);
    q::TrainPlan plan = base_plan(cfg);
    plan.ledger_steps = {ledger_step};
    if (name == "fp32") plan.capture_step = ledger_step;
    out.runs[name] = q::train(n, train_set, test_set, plan, ctx.tty, "fp8: " + name);
    add_ledger_rows(ledger, name, out.runs[name], fp8, w, ledger_step);
    mem.rows.push_back(memory_row(name, n, w, batch));
  }
  Table t = recipes_table(cfg, w, batch);
  const json history = add_recipe_rows(report, t, out.cost, recipes, out.runs);
  t.notes.push_back("test loss and accuracy: the final weights on the test subset, forward under the recipe (delayed: its "
                    "last scales, no amax recorded), in chunks of 1000; gaps: recipe - bf16 (null without bf16); last step "
                    "loss: the training batch's loss at the last step");
  t.notes.push_back("delayed: " + fmt::format("amax_history_len {}, margin {}, amax_compute_algo {}",
                                              cfg.integer("/delayed/amax_history_len"), cfg.integer("/delayed/margin"),
                                              cfg.str("/delayed/amax_compute_algo")));
  report.add(std::move(t));
  report.add(loss_curve_table(cfg, recipes, out.runs));
  if (!ledger.rows.empty()) report.add(std::move(ledger));
  report.add(std::move(mem));
  report.results["history"] = history;
  return out;
}

Report run_fp8(const Context& ctx) {
  const auto& cfg = ctx.cfg;
  Report report;
  if (ctx.device.type() != torch::kCPU) report.env["fp8_note"] = "core/numerics/quant emulates on the CPU; the run uses the CPU";
  const std::string dir = cfg.str("/data/dir");
  Dataset train_set = load_fashion_mnist(dir, "train", cfg.integer("/data/train_samples"));
  Dataset test_set = load_fashion_mnist(dir, "test", cfg.integer("/data/test_samples"));
  const auto w = widths(cfg);
  const auto init = initial_weights(cfg, w);

  // 1. The recipes.
  RecipeRuns recipes = recipes_section(ctx, init, train_set, test_set, w, report);

  // 2. The outlier, the MX blocks, the accumulator.
  const std::size_t L = w.size() - 1;
  const bool has_fp8_layer = [&] {
    for (std::size_t l = 0; l < L; ++l)
      if (layer_is_fp8(cfg, l, L)) return true;
    return false;
  }();
  if (cfg.boolean("/outlier/enabled") && has_fp8_layer) outlier_section(ctx, init, train_set, test_set, w, report);
  fp8::mx_section(ctx, recipes.runs["fp32"].captured, w, report);
  fp8::accumulator_section(ctx, report);
  report.add(std::move(recipes.cost), Store::TimingsByName);

  // 3. The tiny GPT under the same recipes (fp8_gpt.cpp).
  if (cfg.boolean("/gpt/enabled")) {
    const double t0 = now_seconds();
    fp8::gpt_section(ctx, report);
    report.timings["gpt_s"] = now_seconds() - t0;
  }
  return report;
}

/// Memory of a run (core/runtime/memory): the Fashion-MNIST samples (784 floats and an int64 label each,
/// held for the whole run), plus the largest of the parts that run one after the other (each
/// recipe's model is freed before the next):
///  MLP training under a recipe: 6 parameter-sized fp32 tensors (the initial weights, the master
///        leaves, their gradients, the quantized copies of W the out and dgrad GEMMs read, the
///        fp32 W captured for the MX table) and 8 per sample and unit (the Linear and ReLU
///        outputs, x kept for wgrad and its quantized copy, dy and its quantized copy, the
///        quantizer's fp32 temporaries), over a training batch or a 1000-sample evaluation chunk;
///  accumulator: A [m, K] and B [n, K] in fp32, their E4M3 casts and float64 copies (24 bytes an
///        element), and the m x n outputs in float64;
///  GPT section (/gpt/enabled; fp8_gpt.cpp's gpt_memory).
MemoryEstimate fp8_memory(const Config& cfg, int /*world_size*/) {
  const int64_t samples = cfg.integer("/data/train_samples");
  const int64_t rows = mlp_rows_at_once(cfg.integer("/train/batch"), samples, cfg.integer("/data/test_samples"));
  MemoryEstimate mlp_part;
  add_mlp_training(mlp_part, "MLP under a recipe", widths(cfg), rows, 6, 8, "/model/hidden",
                   "/train/batch, /data/test_samples, /model/hidden");
  const double K = static_cast<double>(cfg.integer("/accumulator/k")), m = static_cast<double>(cfg.integer("/accumulator/m")),
               n = static_cast<double>(cfg.integer("/accumulator/n"));
  MemoryEstimate acc;
  acc.add("accumulator operands (fp32, E4M3, float64)", "/accumulator/k, /accumulator/m, /accumulator/n", 24 * (m + n) * K);
  acc.add("accumulator outputs (float64)", "/accumulator/m, /accumulator/n", 4 * 8 * m * n);
  MemoryEstimate e = acc.total() > mlp_part.total() ? acc : mlp_part;
  if (cfg.boolean("/gpt/enabled")) {
    MemoryEstimate gpt = fp8::gpt_memory(cfg);
    if (gpt.total() > e.total()) e = gpt;
  }
  e.add("Fashion-MNIST images and labels", "/data/train_samples, /data/test_samples",
        fashion_mnist_bytes(samples + cfg.integer("/data/test_samples")));
  return e;
}

}  // namespace

Experiment fp8_experiment() {
  return {"fp8", "fp8 training recipes emulated bit for bit: tensorwise, delayed, rowwise, blockwise, MXFP8 on Fashion-MNIST (and the tiny GPT)",
          fp8_spec, run_fp8, validate_fp8, fp8_memory};
}

}  // namespace mpt
