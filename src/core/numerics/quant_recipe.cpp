// Low-precision quantizers — the recipes (tensorwise, rowwise, blockwise, MXFP8, NVFP4, ... as
// GemmRecipe per GEMM), their stored bytes, delayed scaling's amax history and the quantized
// linear layer (all three GEMMs): see quant.hpp and docs/fp8.md. The element formats, the block
// quantizer and the GEMM: quant.cpp.
#include "core/numerics/quant.hpp"
#include "core/numerics/precision.hpp"

#include "core/runtime/compat.hpp"
#include "core/runtime/memory.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace mpt::quant {

// ═════════════════════════════ quantized linear layer ═════════════════════════════

namespace {

using detail::splitmix64;

QuantSpec spec(Element e, BlockShape b, ScaleFormat s = ScaleFormat::FP32) {
  QuantSpec q;
  q.element = e;
  q.block = b;
  q.scale = s;
  return q;
}

/// C = Q(A)·Q(Bt)ᵀ (+ bias), with the ledger.
torch::Tensor gemm_with_bias(const torch::Tensor& a, const torch::Tensor& bt, const torch::Tensor& bias,
                             const GemmRecipe& r, std::uint64_t seed, GemmLedger* ledger, double* amax_a = nullptr,
                             double* amax_b = nullptr) {
  torch::Tensor a_in = a, b_in = bt;
  if (r.rht) {
    const std::uint64_t s = splitmix64(seed ^ 0x52485431ULL);
    a_in = rht16(a, s);
    b_in = rht16(bt, s);
  }
  QuantSpec sa = r.a, sb = r.b;
  sa.seed = splitmix64(seed + 1);
  sb.seed = splitmix64(seed + 2);
  const Quantized qa = quantize(a_in, sa), qb = quantize(b_in, sb);
  if (amax_a) *amax_a = qa.amax;
  if (amax_b) *amax_b = qb.amax;
  torch::Tensor c;
  if (r.acc.significand_bits == 0)
    c = bias.defined() ? torch::addmm(bias, qa.values, qb.values.t()) : qa.values.mm(qb.values.t());
  else
    c = bias.defined() ? gemm(qa.values, qb.values, r.acc) + bias : gemm(qa.values, qb.values, r.acc);
  if (ledger) {
    ledger->a = operand_ledger(qa);
    ledger->b = operand_ledger(qb);
    auto af = a.to(torch::kFloat), bf = bt.to(torch::kFloat);
    auto ref = bias.defined() ? torch::addmm(bias, af, bf.t()) : af.mm(bf.t());
    ledger->rel_error = relative_error(c, ref);
  }
  return c;
}

std::uint64_t gemm_seed(std::uint64_t seed, std::int64_t step, int gemm) {
  return splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(step) * 3 + static_cast<std::uint64_t>(gemm)));
}

struct QuantLinearFunction : public torch::autograd::Function<QuantLinearFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor w, torch::Tensor b,
                               std::int64_t layer) {
    auto* L = reinterpret_cast<QuantLinearImpl*>(layer);
    ctx->save_for_backward({x, w});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["step"] = L->step_;
    if (b.numel() == 0) b = torch::Tensor();
    ctx->saved_data["bias"] = b.defined();
    GemmLedger lg;
    lg.step = L->step_;
    lg.gemm = "out";
    GemmRecipe r = L->recipe_.out;
    const bool delayed = !L->amax_.empty();
    if (delayed) {  // roles x, W, dy
      r.a.static_scale = L->amax_[0].scale();
      r.b.static_scale = L->amax_[1].scale();
    }
    double ax = 0, aw = 0;
    auto y = gemm_with_bias(x, w, b, r, gemm_seed(L->recipe_.seed, L->step_, 0), L->keep_ledger ? &lg : nullptr, &ax, &aw);
    if (L->keep_ledger) L->ledger_.push_back(lg);
    if (delayed && L->is_training()) {
      L->amax_[0].record(ax);
      L->amax_[1].record(aw);
    }
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list g) {
    auto* L = reinterpret_cast<QuantLinearImpl*>(ctx->saved_data["layer"].toInt());
    const std::int64_t step = ctx->saved_data["step"].toInt();
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    auto dy = g[0];
    GemmLedger ld, lw;
    ld.step = lw.step = step;
    ld.gemm = "dgrad";
    lw.gemm = "wgrad";
    const bool keep = L->keep_ledger;
    GemmRecipe rd = L->recipe_.dgrad, rw = L->recipe_.wgrad;
    const bool delayed = !L->amax_.empty();
    if (delayed) {  // the same three scales, read transposed: dy, W^T; dy^T, x^T
      rd.a.static_scale = rw.a.static_scale = L->amax_[2].scale();
      rd.b.static_scale = L->amax_[1].scale();
      rw.b.static_scale = L->amax_[0].scale();
    }
    double ady = 0;
    auto dx = gemm_with_bias(dy, w.t(), torch::Tensor(), rd, gemm_seed(L->recipe_.seed, step, 1), keep ? &ld : nullptr, &ady);
    auto dw = gemm_with_bias(dy.t(), x.t(), torch::Tensor(), rw, gemm_seed(L->recipe_.seed, step, 2), keep ? &lw : nullptr);
    if (delayed && L->is_training()) L->amax_[2].record(ady);
    if (keep) {
      L->ledger_.push_back(ld);
      L->ledger_.push_back(lw);
    }
    torch::Tensor db = ctx->saved_data["bias"].toBool() ? dy.sum(0) : torch::Tensor();
    return {dx, dw, db, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor quantized_gemm(const torch::Tensor& a, const torch::Tensor& bt, const GemmRecipe& r, std::uint64_t seed,
                             GemmLedger* ledger) {
  return gemm_with_bias(a, bt, torch::Tensor(), r, seed, ledger);
}

OperandLedger operand_ledger(const Quantized& q) {
  OperandLedger l;
  l.amax = q.amax;
  if (q.scale.defined() && q.scale.numel() > 0) {
    l.scale_min = q.scale.min().item<double>();
    l.scale_max = q.scale.max().item<double>();
  }
  l.saturated_frac = q.numel ? static_cast<double>(q.saturated) / static_cast<double>(q.numel) : 0.0;
  l.flushed_frac = q.numel ? static_cast<double>(q.flushed) / static_cast<double>(q.numel) : 0.0;
  return l;
}

const std::vector<std::string>& recipe_names() {
  static const std::vector<std::string> v = {"fp32", "bf16", "tensorwise", "rowwise", "blockwise", "mxfp8", "mxfp8_floor", "nvfp4", "mxfp4"};
  return v;
}

QuantRecipe recipe(const std::string& name, const RecipeOptions& opt) {
  if (opt.tile < 1 || opt.weight_block < 1 || opt.mx_block < 1)
    throw std::invalid_argument(fmt::format("recipe: block sizes tile {}, weight_block {}, mx_block {} (expected >= 1)", opt.tile,
                                            opt.weight_block, opt.mx_block));
  QuantRecipe r;
  r.name = name;
  const BlockShape tensor{0, 0}, row{1, 0};
  auto all = [&](QuantSpec s) { r.out.a = r.out.b = r.dgrad.a = r.dgrad.b = r.wgrad.a = r.wgrad.b = s; };
  if (name == "fp32") return r;
  if (name == "bf16") {  // torch.autocast(dtype=torch.bfloat16): GEMM operands in bf16, fp32 accumulation
    all(spec(Element::BF16, tensor));
    return r;
  }
  if (name == "tensorwise") {  // torchao Float8LinearRecipeName.TENSORWISE
    all(spec(Element::E4M3, tensor));
    r.dgrad.a = r.wgrad.a = spec(Element::E5M2, tensor);  // grad_output in E5M2
  } else if (name == "rowwise") {  // torchao ROWWISE: E4M3, axiswise along k, power-of-two scales
    QuantSpec s = spec(Element::E4M3, row);
    s.pow2_scale = true;
    all(s);
  } else if (name == "blockwise") {  // DeepSeek-V3 §3.3.1
    all(spec(Element::E4M3, {1, opt.tile}));
    r.out.b = r.dgrad.b = spec(Element::E4M3, {opt.weight_block, opt.weight_block});  // W [N,K] and Wᵀ [K,N]
  } else if (name == "mxfp8" || name == "mxfp8_floor") {
    QuantSpec s = spec(Element::E4M3, {1, opt.mx_block}, ScaleFormat::E8M0);
    s.rule = name == "mxfp8" ? E8M0Rule::RCEIL : E8M0Rule::FLOOR;
    all(s);
  } else if (name == "mxfp4") {  // OCP MX v1.0 MXFP4: E2M1 in 1x32 blocks, E8M0 scales, the spec's FLOOR rule
    all(spec(Element::E2M1, {1, opt.mx_block}, ScaleFormat::E8M0));
  } else if (name == "nvfp4") {  // NVFP4 paper §4: 2-D weights, SR on gradients, RHT on wgrad
    QuantSpec act = spec(Element::E2M1, {1, 16}, ScaleFormat::UE4M3);
    act.tensor_scale = true;
    QuantSpec wt = act;
    wt.block = {16, 16};
    QuantSpec grad = act;
    grad.rounding = Rounding::Stochastic;
    r.out.a = act;
    r.out.b = wt;
    r.dgrad.a = grad;
    r.dgrad.b = wt;
    r.wgrad.a = grad;
    r.wgrad.b = act;
    r.wgrad.rht = true;
  } else {
    throw std::invalid_argument("unknown quantization recipe \"" + name +
                                "\" (expected fp32, bf16, tensorwise, rowwise, blockwise, mxfp8, mxfp8_floor, nvfp4, mxfp4)");
  }
  if (opt.grad_element) {
    if (*opt.grad_element != Element::E4M3 && *opt.grad_element != Element::E5M2)
      throw std::invalid_argument("recipe: gradient element " + element_info(*opt.grad_element).name + " (expected e4m3 or e5m2)");
    r.dgrad.a.element = r.wgrad.a.element = *opt.grad_element;
  }
  return r;
}

namespace {
bool divides(BlockShape b, std::int64_t rows, std::int64_t cols) {
  return (b.rows == 0 || rows % b.rows == 0) && (b.cols == 0 || cols % b.cols == 0);
}
bool quantized(const QuantSpec& s) { return s.element != Element::FP32 && s.element != Element::BF16; }
/// Scale values of a [rows, cols] operand under `s`, and their bytes.
std::int64_t scale_count(const QuantSpec& s, std::int64_t rows, std::int64_t cols) {
  if (!quantized(s)) return 0;
  return (s.block.rows ? rows / s.block.rows : 1) * (s.block.cols ? cols / s.block.cols : 1);
}
std::int64_t scale_bytes(const QuantSpec& s, std::int64_t rows, std::int64_t cols) {
  if (!quantized(s)) return 0;
  const std::int64_t per = s.scale == ScaleFormat::FP32 ? 4 : 1;
  return scale_count(s, rows, cols) * per + (s.scale == ScaleFormat::UE4M3 && s.tensor_scale ? 4 : 0);
}
std::int64_t element_bytes(const QuantSpec& s, std::int64_t numel) {
  const int bits = element_info(s.element).bits;
  return (numel * bits + 7) / 8;
}
/// Whether quantizing W^T under `t` gives the same tensor (transposed) as W under `w`.
bool same_under_transpose(const QuantSpec& w, const QuantSpec& t) {
  return w.element == t.element && w.scale == t.scale && w.rule == t.rule && w.pow2_scale == t.pow2_scale &&
         w.block.rows == t.block.cols && w.block.cols == t.block.rows;
}
}  // namespace

std::string shape_error(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n) {
  struct Op {
    const char* gemm;
    const char* side;
    const char* what;
    const QuantSpec* s;
    std::int64_t rows, cols;
  };
  const Op ops[] = {{"out", "A", "x", &r.out.a, m, k},          {"out", "B", "W", &r.out.b, n, k},
                    {"dgrad", "A", "dy", &r.dgrad.a, m, n},     {"dgrad", "B", "W^T", &r.dgrad.b, k, n},
                    {"wgrad", "A", "dy^T", &r.wgrad.a, n, m},   {"wgrad", "B", "x^T", &r.wgrad.b, k, m}};
  for (const Op& o : ops)
    if (quantized(*o.s) && !divides(o.s->block, o.rows, o.cols))
      return fmt::format("{} operand {} ({} [{}, {}]): block {} does not divide it", o.gemm, o.side, o.what, o.rows, o.cols,
                         block_name(o.s->block));
  for (const GemmRecipe* g : {&r.out, &r.dgrad, &r.wgrad})
    if (g->rht) {
      const std::int64_t kk = g == &r.out ? k : g == &r.dgrad ? n : m;
      if (kk % 16 != 0) return fmt::format("RHT: the reduction dimension {} is not a multiple of 16", kk);
    }
  return "";
}

StoredBytes stored_bytes(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n) {
  StoredBytes b;
  const std::int64_t params = n * k + n;
  b.weights = params * 4;
  if (quantized(r.out.b) || r.out.b.element == Element::BF16) {
    b.weights += element_bytes(r.out.b, n * k);
    b.scales += scale_bytes(r.out.b, n, k);
    if (!same_under_transpose(r.out.b, r.dgrad.b)) {
      b.weights += element_bytes(r.dgrad.b, n * k);
      b.scales += scale_bytes(r.dgrad.b, k, n);
    }
  }
  b.activations = element_bytes(r.wgrad.b, m * k);
  b.scales += scale_bytes(r.wgrad.b, k, m);
  b.gradients = params * 4;
  return b;
}

namespace {
/// LibTorch's dtype for `e`'s codes, and how many codes one element of it holds; nullopt if none.
std::optional<std::pair<torch::ScalarType, std::int64_t>> element_dtype(Element e) {
  switch (e) {
    case Element::FP32: return std::make_pair(torch::kFloat, std::int64_t{1});
    case Element::BF16: return std::make_pair(torch::kBFloat16, std::int64_t{1});
#if MPT_COMPAT_HAS_FLOAT8
    case Element::E4M3: return std::make_pair(torch::kFloat8_e4m3fn, std::int64_t{1});
    case Element::E5M2: return std::make_pair(torch::kFloat8_e5m2, std::int64_t{1});
#endif
#if MPT_COMPAT_HAS_FLOAT8_E8M0
    case Element::E8M0: return std::make_pair(torch::kFloat8_e8m0fnu, std::int64_t{1});
#endif
#if MPT_COMPAT_HAS_FLOAT4
    case Element::E2M1: return std::make_pair(torch::kFloat4_e2m1fn_x2, std::int64_t{2});
#endif
    default: return std::nullopt;  // E2M3 / E3M2: no FP6 dtype in any LibTorch
  }
}
std::optional<torch::ScalarType> scale_dtype(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::FP32: return torch::kFloat;
#if MPT_COMPAT_HAS_FLOAT8_E8M0
    case ScaleFormat::E8M0: return torch::kFloat8_e8m0fnu;
#endif
#if MPT_COMPAT_HAS_FLOAT8
    case ScaleFormat::UE4M3: return torch::kFloat8_e4m3fn;  // the sign bit unused, as NVFP4's scales
#endif
    default: return std::nullopt;
  }
}

/// Holds tensors of one part and reports the allocator's live bytes they added.
struct MeasuredPart {
  std::vector<torch::Tensor> held;
  std::int64_t before = current_bytes(torch::kCPU);
  bool ok = true;
  void codes(Element e, std::int64_t numel) {
    const auto d = element_dtype(e);
    if (!d) { ok = false; return; }
    held.push_back(torch::empty({(numel + d->second - 1) / d->second}, torch::TensorOptions().dtype(d->first)));
  }
  void scales(const QuantSpec& s, std::int64_t rows, std::int64_t cols) {
    if (!quantized(s)) return;
    const auto d = scale_dtype(s.scale);
    if (!d) { ok = false; return; }
    held.push_back(torch::empty({scale_count(s, rows, cols)}, torch::TensorOptions().dtype(*d)));
    if (s.scale == ScaleFormat::UE4M3 && s.tensor_scale) held.push_back(torch::empty({1}, torch::kFloat));
  }
  std::int64_t bytes() const { return current_bytes(torch::kCPU) - before; }
};
}  // namespace

std::optional<StoredBytes> measured_stored_bytes(const QuantRecipe& r, std::int64_t m, std::int64_t k, std::int64_t n) {
  install_counting_allocator();
  StoredBytes b;
  bool ok = true;
  {  // weights: the fp32 masters W and b, and the quantized copies of W the GEMMs read
    MeasuredPart w;
    w.codes(Element::FP32, n * k + n);
    if (quantized(r.out.b) || r.out.b.element == Element::BF16) {
      w.codes(r.out.b.element, n * k);
      if (!same_under_transpose(r.out.b, r.dgrad.b)) w.codes(r.dgrad.b.element, n * k);
    }
    b.weights = w.bytes();
    ok = ok && w.ok;
  }
  {  // scales of every stored quantized tensor
    MeasuredPart s;
    if (quantized(r.out.b) || r.out.b.element == Element::BF16) {
      s.scales(r.out.b, n, k);
      if (!same_under_transpose(r.out.b, r.dgrad.b)) s.scales(r.dgrad.b, k, n);
    }
    s.scales(r.wgrad.b, k, m);
    b.scales = s.bytes();
    ok = ok && s.ok;
  }
  {  // activations: x saved for wgrad in wgrad's B format
    MeasuredPart a;
    a.codes(r.wgrad.b.element, m * k);
    b.activations = a.bytes();
    ok = ok && a.ok;
  }
  {  // gradients: the fp32 weight and bias gradients
    MeasuredPart g;
    g.codes(Element::FP32, n * k + n);
    b.gradients = g.bytes();
    ok = ok && g.ok;
  }
  if (!ok) return std::nullopt;
  return b;
}

AmaxComputeAlgo parse_amax_compute_algo(const std::string& name) {
  if (name == "max") return AmaxComputeAlgo::Max;
  if (name == "most_recent") return AmaxComputeAlgo::MostRecent;
  throw std::invalid_argument("unknown amax_compute_algo \"" + name + "\" (expected max or most_recent)");
}

AmaxHistory::AmaxHistory(const DelayedScaling& recipe, double fp8_max) : recipe_(recipe), fp8_max_(fp8_max) {
  if (recipe.amax_history_len < 1)
    throw std::invalid_argument(fmt::format("delayed scaling: amax_history_len {} (expected >= 1)", recipe.amax_history_len));
  history_.assign(static_cast<std::size_t>(recipe.amax_history_len), 0.0);
}

void AmaxHistory::record(double amax) {
  history_[0] = std::isnan(amax) || std::isnan(history_[0]) ? std::numeric_limits<double>::quiet_NaN() : std::max(history_[0], amax);
}

void AmaxHistory::update() {
  // TE _compute_amax_and_update_history: max over the history (torch.max: NaN wins) or history[0].
  float amax = 0.0f;
  if (recipe_.amax_compute_algo == AmaxComputeAlgo::MostRecent) {
    amax = static_cast<float>(history_[0]);
  } else {
    for (double h : history_) {
      if (std::isnan(h)) { amax = NAN; break; }
      amax = std::max(amax, static_cast<float>(h));
    }
  }
  // TE _default_sf_compute: sf = (fp8_max / amax) / 2^margin in fp32; where(amax > 0, sf, scale);
  // where(isfinite(amax), sf, scale).
  const float sf = (static_cast<float>(fp8_max_) / amax) / std::exp2(static_cast<float>(recipe_.margin));
  if (amax > 0.0f && std::isfinite(amax)) scale_ = sf;
  // TE _update_amax_history: torch.roll(history, -1, 0), then history[0] = 0.
  std::rotate(history_.begin(), history_.begin() + 1, history_.end());
  history_[0] = 0.0;
}

QuantLinearImpl::QuantLinearImpl(std::int64_t in_features, std::int64_t out_features, QuantRecipe r, bool with_bias)
    : recipe_(std::move(r)) {
  torch::nn::Linear ref(torch::nn::LinearOptions(in_features, out_features).bias(with_bias));
  weight = register_parameter("weight", ref->weight.detach().clone());
  if (with_bias) bias = register_parameter("bias", ref->bias.detach().clone());
}

torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, QuantLinearImpl& layer) {
  if (x.dim() < 1 || x.size(-1) != w.size(1))
    throw std::invalid_argument(fmt::format("quantized_linear: expected x [..., {}] for W [{}, {}], got x [{}]", w.size(1), w.size(0),
                                            w.size(1), fmt::join(x.sizes(), ",")));
  auto x2 = x.reshape({-1, w.size(1)});
  // A custom autograd function takes no undefined tensor: an empty one stands for "no bias".
  auto y = QuantLinearFunction::apply(x2, w, b.defined() ? b : torch::empty({0}), reinterpret_cast<std::int64_t>(&layer));
  ++layer.step_;
  std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return y.reshape(shape);
}

torch::Tensor QuantLinearImpl::forward(const torch::Tensor& x) { return quantized_linear(x, weight, bias, *this); }

void QuantLinearImpl::set_delayed_scaling(const DelayedScaling& d) {
  for (const GemmRecipe* g : {&recipe_.out, &recipe_.dgrad, &recipe_.wgrad})
    for (const QuantSpec* s : {&g->a, &g->b})
      if (!quantized(*s) || s->scale != ScaleFormat::FP32 || s->block.rows != 0 || s->block.cols != 0 || s->pow2_scale)
        throw std::invalid_argument("delayed scaling: recipe \"" + recipe_.name +
                                    "\" is not per tensor with fp32 scales in every operand (expected the tensorwise recipe)");
  amax_.clear();
  amax_.emplace_back(d, element_info(recipe_.out.a.element).max);    // x
  amax_.emplace_back(d, element_info(recipe_.out.b.element).max);    // W
  amax_.emplace_back(d, element_info(recipe_.dgrad.a.element).max);  // dy
}

void QuantLinearImpl::update_scales() {
  for (auto& h : amax_) h.update();
}

}  // namespace mpt::quant
