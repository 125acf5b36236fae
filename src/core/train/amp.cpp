// Dynamic loss scaling and emulated low-precision storage. See amp.hpp.
#include "core/train/amp.hpp"
#include "core/numerics/quant.hpp"
#include "core/numerics/rounding_simd.hpp"

#include <atomic>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

namespace mpt {

MinScalePolicy parse_min_scale_policy(const std::string& s) {
  if (s == "clamp") return MinScalePolicy::Clamp;
  if (s == "error") return MinScalePolicy::Error;
  throw std::invalid_argument("min_scale_policy: expected \"clamp\" or \"error\", got \"" + s + "\"");
}

ScaleRule parse_scale_rule(const std::string& s) {
  if (s == "megatron") return ScaleRule::Megatron;
  if (s == "deepspeed") return ScaleRule::DeepSpeed;
  throw std::invalid_argument("rule: expected \"megatron\" or \"deepspeed\", got \"" + s + "\"");
}

const char* scale_rule_name(ScaleRule r) { return r == ScaleRule::DeepSpeed ? "deepspeed" : "megatron"; }

namespace {

void validate(const GradScaler::Options& o) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("GradScaler: " + what); };
  const float s = static_cast<float>(o.init_scale);
  if (!(o.init_scale > 0) || !std::isfinite(s) || s == 0.0f)
    bad(fmt::format("init_scale must be > 0 and finite in fp32, got {}", o.init_scale));
  if (!(o.growth_factor > 1.0) || !std::isfinite(o.growth_factor))
    bad(fmt::format("growth_factor must be > 1, got {}", o.growth_factor));
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
    bad(fmt::format("backoff_factor must be in (0, 1), got {}", o.backoff_factor));
  if (o.growth_interval < 1) bad(fmt::format("growth_interval must be >= 1, got {}", o.growth_interval));
  if (o.hysteresis < 1) bad(fmt::format("hysteresis must be >= 1, got {}", o.hysteresis));
  if (!(o.min_scale > 0) || static_cast<float>(o.min_scale) == 0.0f || o.min_scale > o.init_scale)
    bad(fmt::format("min_scale must be > 0 (and nonzero in fp32) and <= init_scale, got {}", o.min_scale));
}

}  // namespace

GradScaler::GradScaler() : GradScaler(Options{}) {}

GradScaler::GradScaler(Options o) : opt_(o) {
  validate(opt_);
  scale_ = static_cast<float>(opt_.init_scale);  // torch.full((1,), init_scale, dtype=float32)
  hysteresis_tracker_ = opt_.hysteresis;
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return loss * torch::scalar_tensor(scale_, loss.options().dtype(torch::kFloat)).to(loss.scalar_type());
}

bool GradScaler::unscale_(const std::vector<torch::Tensor>& params) {
  if (stage_ == Stage::Unscaled)
    throw std::logic_error("unscale_() has already been called since the last update()");
  if (stage_ == Stage::Stepped) throw std::logic_error("unscale_() is being called after step()");
  // inv_scale = self._scale.double().reciprocal().float()
  const float inv = static_cast<float>(1.0 / static_cast<double>(scale_));
  torch::NoGradGuard ng;
  bool inf = false;
  for (const auto& p : params) {
    auto g = p.grad();
    if (!g.defined()) continue;
    // _amp_foreach_non_finite_check_and_unscale_: the check looks at the scaled values;
    // every gradient is multiplied regardless.
    if (!inf && !torch::isfinite(g).all().item<bool>()) inf = true;
    g.mul_(inv);
  }
  found_inf_ = inf;
  stage_ = Stage::Unscaled;
  return inf;
}

bool GradScaler::step(const std::vector<torch::Tensor>& params, const std::function<void()>& optimizer_step) {
  if (stage_ == Stage::Stepped) throw std::logic_error("step() has already been called since the last update()");
  if (stage_ == Stage::Ready) unscale_(params);
  stage_ = Stage::Stepped;
  if (found_inf_) return false;
  optimizer_step();
  return true;
}

void GradScaler::update() {
  if (stage_ == Stage::Ready) throw std::logic_error("No inf checks were recorded prior to update()");
  update_with(found_inf_);
}

void GradScaler::update_with(bool found_inf) {
  stage_ = Stage::Ready;
  found_inf_ = found_inf;
  if (opt_.rule == ScaleRule::DeepSpeed) return update_deepspeed(found_inf);
  if (found_inf) {
    growth_tracker_ = 0;
    if (hysteresis_tracker_ > 0) --hysteresis_tracker_;
    if (hysteresis_tracker_ > 0) return;  // tolerated (hysteresis)
    back_off();
  } else {
    if (opt_.consecutive_hysteresis) hysteresis_tracker_ = opt_.hysteresis;
    const int64_t successful = growth_tracker_ + 1;
    if (successful == opt_.growth_interval) {
      grow();
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
}

// DeepSpeed's DynamicLossScaler.update_scale, with stable_interval = cur_iter - last_overflow_iter - 1
// held as growth_tracker_ (both counters only ever enter through that difference). Its cur_hysteresis
// stays at 1 once reached where Megatron's tracker goes to 0: the back-off decisions are the same.
void GradScaler::update_deepspeed(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    if (opt_.hysteresis == 1 || hysteresis_tracker_ <= 1) {
      hysteresis_tracker_ = std::min<int64_t>(hysteresis_tracker_, 1);
      back_off();
    } else {
      --hysteresis_tracker_;
    }
    return;
  }
  if (opt_.consecutive_hysteresis) hysteresis_tracker_ = opt_.hysteresis;
  const int64_t stable_interval = growth_tracker_;
  if (stable_interval > 0 && stable_interval % opt_.growth_interval == 0) grow();
  growth_tracker_ = stable_interval + 1;
}

void GradScaler::back_off() {
  const float floor = static_cast<float>(opt_.min_scale);
  if (opt_.min_scale_policy == MinScalePolicy::Error && scale_ <= floor)
    throw LossScaleError(fmt::format(
        "loss scale is already at its minimum ({:g}) and gradients still overflow; "
        "cannot decrease the scale any further",
        scale_));
  // *current_scale = (*current_scale) * backoff_factor  (float × double, stored as float)
  float next = static_cast<float>(static_cast<double>(scale_) * opt_.backoff_factor);
  if (next < floor) next = floor;
  scale_ = next;
}

void GradScaler::grow() {
  const float grown = static_cast<float>(static_cast<double>(scale_) * opt_.growth_factor);
  if (std::isfinite(grown)) scale_ = grown;  // do not grow past fp32's range to inf
  if (!opt_.consecutive_hysteresis) hysteresis_tracker_ = opt_.hysteresis;
}

json GradScaler::state_dict() const {
  return {{"scale", static_cast<double>(scale_)},
          {"growth_factor", opt_.growth_factor},
          {"backoff_factor", opt_.backoff_factor},
          {"growth_interval", opt_.growth_interval},
          {"_growth_tracker", growth_tracker_},
          {"rule", scale_rule_name(opt_.rule)},
          {"hysteresis", opt_.hysteresis},
          {"_hysteresis_tracker", hysteresis_tracker_},
          {"consecutive_hysteresis", opt_.consecutive_hysteresis},
          {"min_scale", opt_.min_scale},
          {"min_scale_policy", opt_.min_scale_policy == MinScalePolicy::Clamp ? "clamp" : "error"}};
}

void GradScaler::load_state_dict(const json& s) {
  if (stage_ != Stage::Ready)
    throw std::logic_error("load_state_dict() between unscale_()/step() and update()");
  if (!s.is_object()) throw std::invalid_argument("GradScaler state_dict: expected an object");
  try {
    Options o = opt_;
    o.growth_factor = s.at("growth_factor").get<double>();
    o.backoff_factor = s.at("backoff_factor").get<double>();
    o.growth_interval = s.at("growth_interval").get<int64_t>();
    const double sc = s.at("scale").get<double>();
    o.init_scale = sc;
    if (s.contains("rule")) o.rule = parse_scale_rule(s.at("rule").get<std::string>());
    if (s.contains("hysteresis")) o.hysteresis = s.at("hysteresis").get<int64_t>();
    if (s.contains("consecutive_hysteresis")) o.consecutive_hysteresis = s.at("consecutive_hysteresis").get<bool>();
    if (s.contains("min_scale")) o.min_scale = s.at("min_scale").get<double>();
    if (s.contains("min_scale_policy")) o.min_scale_policy = parse_min_scale_policy(s.at("min_scale_policy").get<std::string>());
    if (o.min_scale > sc) o.min_scale = sc;  // a scale saved at a lower floor stays valid
    validate(o);
    const int64_t tracker = s.at("_growth_tracker").get<int64_t>();
    // megatron's tracker resets at each growth; deepspeed's counts on until the next overflow.
    if (tracker < 0 || (o.rule == ScaleRule::Megatron && tracker >= o.growth_interval))
      throw std::invalid_argument(fmt::format("_growth_tracker must be in [0, growth_interval) under rule "
                                              "megatron, >= 0 under deepspeed; got {}", tracker));
    int64_t hyst = o.hysteresis;
    if (s.contains("_hysteresis_tracker")) hyst = s.at("_hysteresis_tracker").get<int64_t>();
    if (hyst < 0 || hyst > o.hysteresis)
      throw std::invalid_argument(fmt::format("_hysteresis_tracker must be in [0, hysteresis], got {}", hyst));
    opt_ = o;
    scale_ = static_cast<float>(sc);
    growth_tracker_ = tracker;
    hysteresis_tracker_ = hyst;
    found_inf_ = false;
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("GradScaler state_dict: ") + e.what());
  }
}

// ----------------------------------------------------------------------------
// Emulated storage: round in forward, round the incoming gradient in backward.
// ----------------------------------------------------------------------------
namespace {

struct StorageRound : torch::autograd::Function<StorageRound> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t fmt) {
    ctx->saved_data["fmt"] = fmt;
    return round_to(x, static_cast<Format>(fmt));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto f = static_cast<Format>(ctx->saved_data["fmt"].toInt());
    return {round_to(grad[0], f), torch::Tensor()};
  }
};

// StorageRound whose backward also counts the gradient's underflow (round_to_counting_underflow:
// one pass). The counters' addresses travel in saved_data as integers.
struct CountingStorageRound : torch::autograd::Function<CountingStorageRound> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t fmt,
                               int64_t underflow, int64_t total) {
    ctx->saved_data["fmt"] = fmt;
    ctx->saved_data["underflow"] = underflow;
    ctx->saved_data["total"] = total;
    return round_to(x, static_cast<Format>(fmt));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto f = static_cast<Format>(ctx->saved_data["fmt"].toInt());
    auto* under = reinterpret_cast<long long*>(static_cast<std::intptr_t>(ctx->saved_data["underflow"].toInt()));
    auto* total = reinterpret_cast<long long*>(static_cast<std::intptr_t>(ctx->saved_data["total"].toInt()));
    int64_t n = 0;
    auto r = round_to_counting_underflow(grad[0], f, &n);
    *under += n;
    *total += grad[0].numel();
    return {r, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor emulate_storage(const torch::Tensor& x, Format f) {
  if (f == Format::FP32) return x;
  return StorageRound::apply(x, static_cast<int64_t>(f));
}

torch::Tensor emulate_storage_counting(const torch::Tensor& x, Format f, long long* underflow, long long* total) {
  if (f == Format::FP32) return x;
  return CountingStorageRound::apply(x, static_cast<int64_t>(f), static_cast<int64_t>(reinterpret_cast<std::intptr_t>(underflow)),
                                     static_cast<int64_t>(reinterpret_cast<std::intptr_t>(total)));
}

namespace {

// sigmoid / tanh whose output is stored in `fmt` and whose backward reads that stored output,
// as a native kernel's saved half tensor is: grad_in = round(g · (1 − y) · y) for sigmoid,
// round(g · (1 − y²)) for tanh, in fp32 with g the incoming gradient rounded to `fmt` — the
// formulas and operand order of ATen's sigmoid_backward / tanh_backward kernels.
struct StoredActivation : torch::autograd::Function<StoredActivation> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t kind,
                               int64_t fmt) {
    auto y = round_to(kind == 0 ? torch::sigmoid(x) : torch::tanh(x), static_cast<Format>(fmt));
    ctx->save_for_backward({y});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["fmt"] = fmt;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto f = static_cast<Format>(ctx->saved_data["fmt"].toInt());
    const auto y = ctx->get_saved_variables()[0];
    const auto g = round_to(grad[0], f);
    auto gi = ctx->saved_data["kind"].toInt() == 0 ? g * (1 - y) * y : g * (1 - y * y);
    return {round_to(gi, f), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor activation_as(const torch::Tensor& x, const std::string& kind, Format f, Compute c) {
  if (kind != "sigmoid" && kind != "tanh" && kind != "relu")
    throw std::invalid_argument("activation_as: expected sigmoid, tanh or relu, got \"" + kind + "\"");
  if (c == Compute::Native || f == Format::FP32) {
    auto h = store_as(x, f, c);
    return kind == "sigmoid" ? torch::sigmoid(h) : kind == "tanh" ? torch::tanh(h) : torch::relu(h);
  }
  // relu's backward needs only the sign of its input, which rounding keeps
  if (kind == "relu") return emulate_storage(torch::relu(x), f);
  return StoredActivation::apply(x, kind == "sigmoid" ? 0 : 1, static_cast<int64_t>(f));
}

torch::Tensor store_as(const torch::Tensor& x, Format f, Compute c) {
  if (c == Compute::Emulated) return emulate_storage(x, f);
  const auto dtype = storage_dtype(f);
  if (f == Format::FP8_E4M3 || f == Format::FP8_E5M2)
    throw std::invalid_argument("store_as: fp8 has no native storage in mpt (use Compute::Emulated)");
  return x.scalar_type() == dtype ? x : x.to(dtype);
}

// ---------------------------------------------------------------------------------------------
// SGD update with the lost-update count, fused
// ---------------------------------------------------------------------------------------------
namespace {

// Vectorised at -O3 without -ftrapping-math, as core/numerics/precision's rounding loops (precision.hpp's
// MPT_ROUNDING_PUSH; no result changes): the fp32 cases inline detail::round_*_element.
MPT_ROUNDING_PUSH
// One pass of w ← R(w − fp32(g)·lr) over [begin, end), counting; W is the stored element type of
// w, G of g, and R rounds the fp32 result to what w stores (identity, or through a narrower type).
template <typename W, typename G, typename Round>
void fused_sgd(W* w, const G* g, float lr, int64_t n, Round round, UpdateCounts& counts) {
  std::atomic<int64_t> updates{0}, lost{0};
  at::parallel_for(0, n, /*grain_size=*/32768, [&](int64_t begin, int64_t end) {
    int64_t u_count = 0, lost_count = 0;
    for (int64_t i = begin; i < end; ++i) {
      const float u = static_cast<float>(g[i]) * lr;
      const W old = w[i];
      const W next = round(static_cast<float>(old) - u);
      const bool intended = u != 0.0f;
      u_count += intended;
      lost_count += intended && static_cast<float>(next) == static_cast<float>(old);
      w[i] = next;
    }
    updates += u_count;
    lost += lost_count;
  });
  counts.updates += updates.load();
  counts.lost += lost.load();
}

// The native fp16 update on widened copies: w, g hold [n] fp16 values in fp32, next gets
// fp16(w − fp32(g)·lr) (round to nearest even, as c10::Half's conversion) in fp32, counting as
// fused_sgd does. The subtraction and the counts are plain loops (vectorised here); the
// rounding is core/numerics/rounding_simd's vector loop (F16C / AVX-512 where the CPU has them).
void sgd_fp16_values(const float* w, const float* g, float* next, float lr, int64_t n, UpdateCounts& counts) {
  std::atomic<int64_t> updates{0}, lost{0};
  at::parallel_for(0, n, /*grain_size=*/32768, [&](int64_t begin, int64_t end) {
    int64_t u_count = 0, lost_count = 0;
    for (int64_t i = begin; i < end; ++i) {
      const float u = g[i] * lr;
      u_count += static_cast<int64_t>(u != 0.0f);
      next[i] = w[i] - u;
    }
    simd::round_span(simd::Half::FP16, next + begin, next + begin, end - begin, /*count=*/false);
    for (int64_t i = begin; i < end; ++i)  // & rather than &&: no branch, so the loop vectorises
      lost_count += static_cast<int64_t>(g[i] * lr != 0.0f) & static_cast<int64_t>(next[i] == w[i]);
    updates += u_count;
    lost += lost_count;
  });
  counts.updates += updates.load();
  counts.lost += lost.load();
}

// The fp32 cases' roundings, as function objects so that they inline into fused_sgd's loop.
struct KeepFp32 {
  float operator()(float x) const { return x; }
};
struct RoundBf16 {
  float operator()(float x) const { return detail::round_bf16_element(x); }
};
struct RoundFp16 {
  float operator()(float x) const { return detail::round_fp16_element(x); }
};

// The native bf16 update on the bits: bf16 -> fp32 is a 16-bit shift, fp32 -> bf16 the vector
// rounding of round_bf16_element (round to nearest even, c10::BFloat16's, for every non-NaN
// input) and its top 16 bits, and a NaN becomes c10::BFloat16's canonical 0x7FC0. c10::BFloat16's
// own conversions did the same through out-of-line calls, three per element: 18 % of a native
// bf16 step of the lossscale MLP (perf, 2 vCPUs AMD EPYC).
inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline uint16_t float_to_bf16_bits(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const float r = detail::round_bf16_element(x);
  uint32_t u;
  std::memcpy(&u, &r, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}
void sgd_bf16_bits(uint16_t* w, const uint16_t* g, float lr, int64_t n, UpdateCounts& counts) {
  std::atomic<int64_t> updates{0}, lost{0};
  at::parallel_for(0, n, /*grain_size=*/32768, [&](int64_t begin, int64_t end) {
    int64_t u_count = 0, lost_count = 0;
    for (int64_t i = begin; i < end; ++i) {
      const float u = bf16_bits_to_float(g[i]) * lr;
      const float old = bf16_bits_to_float(w[i]);
      const uint16_t next = float_to_bf16_bits(old - u);
      const bool intended = u != 0.0f;
      u_count += intended;
      lost_count += intended && bf16_bits_to_float(next) == old;
      w[i] = next;
    }
    updates += u_count;
    lost += lost_count;
  });
  counts.updates += updates.load();
  counts.lost += lost.load();
}
MPT_ROUNDING_POP

}  // namespace

UpdateCounts sgd_update_counting_lost(torch::Tensor& w, const torch::Tensor& g, float lr, Format stored) {
  if (!w.sizes().equals(g.sizes()))
    throw std::invalid_argument(fmt::format("sgd_update_counting_lost: gradient shape {} differs from the weight's {}",
                                            fmt::join(g.sizes(), "x"), fmt::join(w.sizes(), "x")));
  torch::NoGradGuard no_grad;
  UpdateCounts counts;
  const auto wt = w.scalar_type(), gt = g.scalar_type();
  const bool fused = w.device().is_cpu() && g.device().is_cpu() && w.is_contiguous() && g.is_contiguous() &&
                     (wt == torch::kFloat ? (gt == torch::kFloat && (stored == Format::FP32 || stored == Format::BF16 ||
                                                                     stored == Format::FP16))
                                          : ((wt == torch::kBFloat16 || wt == torch::kHalf) && gt == wt));
  const int64_t n = w.numel();
  if (fused && wt == torch::kFloat) {
    float* wp = w.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    // The roundings of ATen's casts (round to nearest, ties to even) on the bits, vectorised:
    // core/numerics/precision's round_element, equal to c10::BFloat16 / c10::Half for every non-NaN input.
    if (stored == Format::FP32) fused_sgd(wp, gp, lr, n, KeepFp32{}, counts);
    else if (stored == Format::BF16) fused_sgd(wp, gp, lr, n, RoundBf16{}, counts);
    else fused_sgd(wp, gp, lr, n, RoundFp16{}, counts);
    return counts;
  }
  if (fused && wt == torch::kBFloat16) {
    static_assert(sizeof(c10::BFloat16) == sizeof(uint16_t), "c10::BFloat16 is its 16 bits");
    sgd_bf16_bits(reinterpret_cast<uint16_t*>(w.data_ptr<c10::BFloat16>()),
                  reinterpret_cast<const uint16_t*>(g.data_ptr<c10::BFloat16>()), lr, n, counts);
    return counts;
  }
  if (fused && wt == torch::kHalf) {
    // c10::Half's conversions are software at the x86-64 baseline mpt builds for (no F16C),
    // element by element, three per element. ATen's casts are vectorised (its kernels are
    // built per CPU capability): widen w and g into
    // scratch fp32 buffers (kept per thread), update them with the vector rounding loop
    // (sgd_fp16_values: c10::Half's round to nearest even, equal for every non-NaN input), and
    // cast the result back, exactly.
    thread_local std::vector<float> wbuf, gbuf, nbuf;
    for (auto* b : {&wbuf, &gbuf, &nbuf}) b->resize(static_cast<std::size_t>(n));
    auto w32 = torch::from_blob(wbuf.data(), {n}, torch::kFloat), g32 = torch::from_blob(gbuf.data(), {n}, torch::kFloat);
    w32.copy_(w.reshape({-1}));
    g32.copy_(g.reshape({-1}));
    sgd_fp16_values(wbuf.data(), gbuf.data(), nbuf.data(), lr, n, counts);
    w.view({-1}).copy_(torch::from_blob(nbuf.data(), {n}, torch::kFloat));  // fp16 values: exact
    return counts;
  }
  // The same arithmetic in ATen's operators (CUDA, fp8 storage, strided tensors).
  auto u = g.to(torch::kFloat) * lr;
  auto next32 = w.to(torch::kFloat) - u;
  auto next = wt == torch::kFloat ? round_to(next32, stored) : next32.to(wt);
  auto intended = u != 0;
  counts.lost = (intended & (next == w)).sum().item<int64_t>();
  counts.updates = intended.sum().item<int64_t>();
  w.copy_(next);
  return counts;
}

namespace {
void check_bf16_update(const char* fn, const torch::Tensor& w, const torch::Tensor& g) {
  if (!w.sizes().equals(g.sizes()))
    throw std::invalid_argument(fmt::format("{}: gradient shape {} differs from the weight's {}", fn,
                                            fmt::join(g.sizes(), "x"), fmt::join(w.sizes(), "x")));
  if (w.scalar_type() != torch::kFloat && w.scalar_type() != torch::kBFloat16)
    throw std::invalid_argument(fmt::format("{}: expected fp32 (holding bf16 values) or bf16 weights, got {}", fn,
                                            c10::toString(w.scalar_type())));
}
// bf16 rounding of fp32 math, as an fp32 tensor (the values a bf16 tensor would hold).
torch::Tensor bf16(const torch::Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat); }
}  // namespace

UpdateCounts sgd_update_stochastic(torch::Tensor& w, const torch::Tensor& g, float lr, std::uint64_t seed) {
  check_bf16_update("sgd_update_stochastic", w, g);
  torch::NoGradGuard no_grad;
  auto u = g.to(torch::kFloat) * lr;
  auto next = quant::round_bf16_stochastic(w.to(torch::kFloat) - u, seed);
  auto intended = u != 0;
  UpdateCounts counts;
  counts.lost = (intended & (next == w.to(torch::kFloat))).sum().item<int64_t>();
  counts.updates = intended.sum().item<int64_t>();
  w.copy_(next);  // exact: next holds bf16 values
  return counts;
}

UpdateCounts sgd_update_kahan(torch::Tensor& w, torch::Tensor& comp, const torch::Tensor& g, float lr) {
  check_bf16_update("sgd_update_kahan", w, g);
  if (!comp.sizes().equals(w.sizes()) || comp.scalar_type() != w.scalar_type())
    throw std::invalid_argument("sgd_update_kahan: the compensation buffer must have the weight's shape and dtype");
  torch::NoGradGuard no_grad;
  auto u = g.to(torch::kFloat) * lr;
  auto w0 = w.to(torch::kFloat), c0 = comp.to(torch::kFloat);
  auto c1 = bf16(c0 - u);
  auto w1 = bf16(w0 + c1);
  auto c2 = bf16(c1 + bf16(w0 - w1));
  auto intended = u != 0;
  UpdateCounts counts;
  counts.lost = (intended & (w1 == w0) & (c2 == c0)).sum().item<int64_t>();
  counts.updates = intended.sum().item<int64_t>();
  w.copy_(w1);
  comp.copy_(c2);
  return counts;
}

SgdMomentum::SgdMomentum(std::vector<torch::Tensor> params, double lr, double momentum)
    : params_(std::move(params)), buffers_(params_.size()), lr_(lr), momentum_(momentum) {
  if (!(lr > 0)) throw std::invalid_argument("SgdMomentum: lr must be > 0");
  if (!(momentum >= 0 && momentum < 1)) throw std::invalid_argument("SgdMomentum: momentum must be in [0, 1)");
}

void SgdMomentum::step() {
  torch::NoGradGuard ng;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    if (!g.defined()) continue;
    auto d = g;
    if (momentum_ != 0) {
      if (!buffers_[i].defined()) buffers_[i] = g.detach().clone();
      else buffers_[i].mul_(momentum_).add_(g);  // dampening 0: alpha = 1 − dampening = 1
      d = buffers_[i];
    }
    params_[i].add_(d, -lr_);
  }
}

void SgdMomentum::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

}  // namespace mpt
